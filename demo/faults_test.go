package demo

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// probeOf builds a probe of n connections: answered ones taking took each,
// then resets, then other failures.
func probeOf(n int, took time.Duration, resets, others int) probe {
	times := make([]time.Duration, n)
	errs := make([]error, n)
	for i := range n {
		times[i] = took
		switch {
		case i >= n-others:
			errs[i] = fmt.Errorf("from 127.0.0.11: %w", os.ErrDeadlineExceeded)
		case i >= n-others-resets:
			errs[i] = &net.OpError{Op: "read", Net: "tcp4", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
		}
	}
	return tallyProbe(times, errs)
}

func TestTallyProbeSortsAnswersResetsAndOtherErrors(t *testing.T) {
	reset := fmt.Errorf("from 127.0.0.11: %w", &net.OpError{Op: "read", Net: "tcp4", Err: os.NewSyscallError("read", syscall.ECONNRESET)})
	closed := errors.New("from 127.0.0.11: connection closed without an answer")
	p := tallyProbe(
		[]time.Duration{5 * time.Millisecond, time.Millisecond, 0, 3 * time.Millisecond, 0, 2 * time.Millisecond},
		[]error{nil, nil, reset, nil, closed, nil},
	)
	if p.n != 6 || len(p.answered) != 4 || p.resets != 1 || p.others != 1 || p.errors() != 2 {
		t.Fatalf("probe = %+v; want 6 connections: 4 answered, 1 reset, 1 other", p)
	}
	if p.firstReset != reset || p.firstOther != closed {
		t.Errorf("first errors = %v, %v", p.firstReset, p.firstOther)
	}
	// Nearest rank over 1, 2, 3, 5 ms: the second.
	if p50, ok := p.p50(); !ok || p50 != 2*time.Millisecond {
		t.Errorf("p50 = %v, %v; want 2ms", p50, ok)
	}
	if _, ok := (probe{n: 3, resets: 3}).p50(); ok {
		t.Errorf("p50 of no answer must not exist")
	}
}

func TestFaultJudgesAcceptExpectedAndRejectTheRest(t *testing.T) {
	n := faultConnections
	before := probeOf(n, 2*time.Millisecond, 0, 0)
	for _, tc := range []struct {
		name  string
		judge func(before, got probe) (string, bool)
		got   probe
		want  bool
		text  string
	}{
		{"fast", judgeFast, before, true, "median 2.0ms, 0/40 errors"},
		{"slow without a toxic", judgeFast, probeOf(n, 150*time.Millisecond, 0, 0), false, "median 150ms, 0/40 errors"},
		{"an error without a toxic", judgeFast, probeOf(n, time.Millisecond, 0, 1), false, "median 1.0ms, 1/40 errors"},
		{"nothing answered", judgeFast, probeOf(n, 0, n, 0), false, "no answer, 40/40 errors"},

		{"300 ms added", judgeLatency, probeOf(n, 302*time.Millisecond, 0, 0), true, "median 302ms (+300ms), 0/40 errors"},
		{"250 ms added", judgeLatency, probeOf(n, 252*time.Millisecond, 0, 0), true, "(+250ms)"},
		{"450 ms added", judgeLatency, probeOf(n, 452*time.Millisecond, 0, 0), true, "(+450ms)"},
		{"latency not applied", judgeLatency, probeOf(n, 3*time.Millisecond, 0, 0), false, "(+1.0ms)"},
		{"latency applied twice", judgeLatency, probeOf(n, 602*time.Millisecond, 0, 0), false, "(+600ms)"},
		{"latency with an error", judgeLatency, probeOf(n, 302*time.Millisecond, 0, 1), false, "1/40 errors"},

		{"half reset", judgeResets, probeOf(n, time.Millisecond, n/2, 0), true, "20/40 reset by the proxy, 20 answered"},
		{"a quarter reset", judgeResets, probeOf(n, time.Millisecond, minResets, 0), true, "10/40 reset"},
		{"three quarters reset", judgeResets, probeOf(n, time.Millisecond, maxResets, 0), true, "30/40 reset"},
		{"none reset: toxic not applied", judgeResets, probeOf(n, time.Millisecond, 0, 0), false, "0/40 reset"},
		{"all reset: toxicity ignored", judgeResets, probeOf(n, time.Millisecond, n, 0), false, "40/40 reset"},
		{"closed without a reset", judgeResets, probeOf(n, time.Millisecond, n/2-1, 1), false, "19/40 reset, 20 answered, 1 failed otherwise"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.judge(before, tc.got)
			if ok != tc.want || !strings.Contains(got, tc.text) {
				t.Errorf("judge = %q, %v; want %v and %q", got, ok, tc.want, tc.text)
			}
		})
	}
	// Without a measurement before, added latency cannot be judged.
	if _, ok := judgeLatency(probeOf(n, 0, n, 0), probeOf(n, 300*time.Millisecond, 0, 0)); ok {
		t.Errorf("latency judged without a measurement before")
	}
}

// Each step's annotation is one a Service accepts, naming the toxic the
// step waits for. (Columns fit whatever their words: see TestTableFitsItsColumns.)
func TestFaultStepsDeclareValidToxics(t *testing.T) {
	ports := []faults.ServicePort{{Name: "http", Number: 80, Protocol: "TCP"}}
	for _, s := range faultSteps() {
		if s.annotation == "" {
			if len(s.toxics) != 0 {
				t.Errorf("step %q waits for toxics it does not declare", s.fault)
			}
			continue
		}
		got, err := faults.ParseAnnotation(s.annotation, ports)
		if err != nil {
			t.Errorf("step %q: %v", s.fault, err)
			continue
		}
		var names []string
		for _, tx := range got["http"] {
			names = append(names, tx.Name)
		}
		if fmt.Sprint(names) != fmt.Sprint(s.toxics) {
			t.Errorf("step %q declares %v, waits for %v", s.fault, names, s.toxics)
		}
	}
}

// The annotation survives YAML as written: what the proxier reads from web.yaml.
func TestWebManifestCarriesTheAnnotation(t *testing.T) {
	for _, value := range []string{"", resetToxic, `[{"name":"it's","type":"latency"}]`} {
		text := service{name: "web", clusterIP: "10.96.0.10", portName: "http", port: 80, proto: "TCP", faults: value}.yaml()
		var svc v1.Service
		if err := yaml.UnmarshalStrict([]byte(text), &svc); err != nil {
			t.Fatalf("%v\n%s", err, text)
		}
		got, ok := svc.Annotations[faults.Annotation]
		if got != value || ok != (value != "") {
			t.Errorf("annotation = %q (present %v), want %q\n%s", got, ok, value, text)
		}
	}
}

// TestFaultSection runs only the fault section against the real proxier:
// about 5 s (the manifest is re-read three times, 40 connections are held
// 300 ms each, 5 at a time), no seed timing.
func TestFaultSection(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real proxier and a 300 ms latency toxic (~5 s)")
	}
	t.Parallel()
	backends, err := startBackends("backend-a", "backend-b", "backend-c")
	if err != nil {
		t.Fatal(err)
	}
	defer stopBackends(backends)
	m := &manifestDir{dir: t.TempDir(), backends: backends}
	if err := m.writeAll(); err != nil {
		t.Fatal(err)
	}
	px, err := startProxier(t.Context(), startInProcess, proxierArgs(m.dir))
	if err != nil {
		t.Fatal(err)
	}
	defer px.stop()
	l := &lab{p: px.p, cn: loopback{}, backends: backends, manifests: m}
	if err := l.waitReady(t.Context()); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	start := time.Now()
	ok, err := l.faultSection(t.Context(), &out, wide)
	took := time.Since(start)
	t.Logf("fault section took %v\n%s", took, out.String())
	if err != nil || !ok {
		t.Fatalf("fault section = %v, %v; want every fault as expected", ok, err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`no fault: web as it is\s+median under 100ms, 0/40 errors\s+median [\d.]+ms, 0/40 errors\s+yes`),
		regexp.MustCompile(`latency: every reply held back 300 ms.*median \d+ms \(\+\d+ms\), 0/40 errors\s+yes`),
		regexp.MustCompile(`annotation kube-userspace-proxy/faults: '\[\{"name": "slow", "type": "latency"`),
		regexp.MustCompile(`reset_peer: half the connections cut with a TCP reset.*\b\d+/40 reset by the proxy, \d+ answered\s+yes`),
		regexp.MustCompile(`as the client saw it: .*connection reset by peer`),
		regexp.MustCompile(`no fault: annotation removed.*median [\d.]+ms, 0/40 errors\s+yes`),
		regexp.MustCompile(`Every fault behaved as expected: yes \(4 of 4\)`),
	} {
		if !want.MatchString(out.String()) {
			t.Errorf("output lacks %q", want)
		}
	}
	if names := l.toxicNames(webServicePort); len(names) != 0 {
		t.Errorf("toxics left on %s after the section: %v", webServicePort, names)
	}
	if took > 10*time.Second {
		t.Errorf("fault section took %v; the demo's budget for it is well under 10 s", took)
	}
}

// The fault section's introduction fits an 80-column terminal, as the
// rest of the demo's prose does.
func TestFaultIntroFitsEightyColumns(t *testing.T) {
	for _, line := range strings.Split(faultIntro(), "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("%d columns: %s", n, line)
		}
	}
}
