package demo

import (
	"bytes"
	"context"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// The demo runs the real proxier against real loopback sockets and real
// time (the seed's 1 s, 2 s and 4 s gaps, then the fault section): about
// 17 s each, so the end-to-end tests run in parallel and are skipped with
// -short.

func TestDemoMatchesSeed(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the seed's timing experiments and the fault section in real time (~17 s)")
	}
	t.Parallel()
	var out bytes.Buffer
	matched, err := Run(t.Context(), &out, false, startInProcess)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	if !matched {
		t.Errorf("demo reports a mismatch with the seed")
	}
	text := out.String()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`plain \(None\).*10/10/10 \(round robin\)\s+yes`),
		regexp.MustCompile(`cli1, 30 new connections.*30/30 on backend-[abc]\s+yes`),
		regexp.MustCompile(`cli2, 30 new connections.*30/30 on backend-[abc]; cli1 on backend-[abc]\s+yes`),
		regexp.MustCompile(`timeoutSeconds 3 by rewriting.*timeout 3 s applied after \S+\s+yes`),
		regexp.MustCompile(`1 s apart.*12/12 same backend\s+yes`),
		// The fixed schedule makes round robin land elsewhere 8 times in 12,
		// but a loaded machine may delay a slot past the next one; "yes"
		// already requires at least one change.
		regexp.MustCompile(`4 s apart.*12/12 re-picked, \d+/12 changed\s+yes`),
		regexp.MustCompile(`every 2 s, 7 times.*1 distinct backend\(s\) in 7 accesses\s+yes`),
		regexp.MustCompile(`pinned backend deleted.*5× (backend-[abc]) \(was backend-[abc]\); pinned again: yes\s+yes`),
		regexp.MustCompile(`udp \(None\).*2/2/2 \(round robin\)\s+yes`),
		regexp.MustCompile(`Every outcome matched the seed: yes \(9/9\)`),
		regexp.MustCompile(`latency: every reply held 300 ms.*\(\+\d+ms\), 0/40 errors\s+yes`),
		regexp.MustCompile(`reset_peer: half the connections reset.*\d+/40 reset by the proxy, \d+ answered\s+yes`),
		regexp.MustCompile(`Every fault behaved as expected: yes \(4/4\)`),
	} {
		if !want.MatchString(text) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// syncBuffer lets the test read what the demo is still writing, and says
// when a line has appeared.
type syncBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	seen chan struct{}
	want string
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	if b.seen != nil && strings.Contains(b.buf.String(), b.want) {
		close(b.seen)
		b.seen = nil
	}
	return n, err
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDemoServe checks that --serve keeps the proxy sockets it printed open
// with all three backends back, until the context ends, and then cleans up.
func TestDemoServe(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the seed's timing experiments and the fault section in real time (~17 s)")
	}
	t.Parallel()
	out := &syncBuffer{seen: make(chan struct{}), want: "The manifests:"}
	ready := out.seen
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type result struct {
		matched bool
		err     error
	}
	done := make(chan result, 1)
	go func() {
		m, err := Run(ctx, out, true, startInProcess)
		done <- result{m, err}
	}()
	select {
	case <-ready:
	case r := <-done:
		t.Fatalf("demo returned before serving: %v\n%s", r.err, out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("no serving banner after 60 s:\n%s", out.String())
	}

	served := out.String()[strings.Index(out.String(), "Serving until Ctrl-C"):]
	web := regexp.MustCompile(`default/web:http\s+tcp (127\.0\.0\.1:\d+)\s+None\s+→ backend-a, backend-b, backend-c`).FindStringSubmatch(served)
	sticky := regexp.MustCompile(`default/web-sticky:http\s+tcp (127\.0\.0\.1:\d+)\s+ClientIP 10800s\s+→ backend-a, backend-b, backend-c`).FindStringSubmatch(served)
	echo := regexp.MustCompile(`default/echo:echo\s+udp (127\.0\.0\.1:\d+)`).FindStringSubmatch(served)
	if web == nil || sticky == nil || echo == nil {
		t.Fatalf("serving banner lacks a service port with its three backends:\n%s", served)
	}
	if !strings.Contains(served, "try: "+tryTCP("127.0.0.1", strings.Split(web[1], ":")[1])) || !strings.Contains(served, "/debug/services") {
		t.Errorf("serving banner lacks the hints:\n%s", served)
	}
	// The hints work as printed, with and without curl and nc.
	webHost, webPort, _ := strings.Cut(web[1], ":")
	echoHost, echoPort, _ := strings.Cut(echo[1], ":")
	for _, h := range []struct {
		cmd, need, want string
	}{
		{tcpHint(true, webHost, webPort), "curl", "backend-"},
		{tcpHint(false, webHost, webPort), "bash", "HTTP/1.1 200 OK"},
		{udpHint(true, echoHost, echoPort), "nc", "backend-"},
		{udpHint(false, echoHost, echoPort), "bash", ": hi"},
	} {
		if !installed(h.need) {
			t.Logf("%s is not installed here: hint %q not tried", h.need, h.cmd)
			continue
		}
		out, err := exec.CommandContext(ctx, "bash", "-c", h.cmd).CombinedOutput()
		if err != nil || !strings.Contains(string(out), h.want) || !strings.Contains(string(out), "backend-") {
			t.Errorf("hint %q: %v, output %q", h.cmd, err, out)
		}
	}

	// What a user would do: connect to the printed addresses.
	webAddr := netip.MustParseAddrPort(web[1])
	seen := map[string]bool{}
	for range 3 {
		name, err := accessTCP(ctx, webAddr, clientIP(99))
		if err != nil {
			t.Fatalf("printed web address: %v", err)
		}
		seen[name] = true
	}
	if len(seen) != 3 {
		t.Errorf("3 connections to web reached %v, want all three backends", seen)
	}
	if name, err := accessUDP(netip.MustParseAddrPort(echo[1]), clientIP(99)); err != nil || !strings.HasPrefix(name, "backend-") {
		t.Errorf("printed echo address answered %q, %v", name, err)
	}

	cancel()
	r := <-done
	if r.err != nil || !r.matched {
		t.Errorf("demo --serve = %v, %v; want matched, no error\n%s", r.matched, r.err, out.String())
	}
	// Everything is closed once demo returns: the printed socket is gone.
	if _, err := accessTCP(t.Context(), webAddr, clientIP(99)); err == nil {
		t.Errorf("%s still answers after the demo stopped", webAddr)
	}
}

func TestTally(t *testing.T) {
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{nil, ""},
		{[]string{"a"}, "1"},
		{[]string{"a", "b", "a", "c", "a", "b"}, "3/2/1"},
		{[]string{"b", "b", "a", "a"}, "2/2"},
	} {
		if _, got := tally(tc.names); got != tc.want {
			t.Errorf("tally(%v) = %q, want %q", tc.names, got, tc.want)
		}
	}
}

func TestTrialRowsJudgeOutcomes(t *testing.T) {
	seven := func(names ...string) []string {
		out := make([]string, 0, refreshTimes)
		for len(out) < refreshTimes {
			out = append(out, names...)
		}
		return out[:refreshTimes]
	}
	for _, tc := range []struct {
		name string
		res  trialResults
		want [3]bool // short, long, refresh matched
	}{
		{"all as the seed", trialResults{shortSame: 12, longExpired: 12, longChanged: 8, refreshed: seven("a")}, [3]bool{true, true, true}},
		{"a short trial lost its pin", trialResults{shortSame: 11, longExpired: 12, longChanged: 8, refreshed: seven("a")}, [3]bool{false, true, true}},
		{"timeout not applied: nothing expired", trialResults{shortSame: 12, longExpired: 0, longChanged: 0, refreshed: seven("a")}, [3]bool{true, false, true}},
		{"expired but round robin landed on the same backend every time", trialResults{shortSame: 12, longExpired: 12, longChanged: 0, refreshed: seven("a")}, [3]bool{true, false, true}},
		{"timeout counted from the first access", trialResults{shortSame: 12, longExpired: 12, longChanged: 8, refreshed: seven("a", "a", "b")}, [3]bool{true, true, false}},
		{"refresh series cut short", trialResults{shortSame: 12, longExpired: 12, longChanged: 8, refreshed: []string{"a"}}, [3]bool{true, true, false}},
		{"an access failed", trialResults{shortSame: 12, longExpired: 12, longChanged: 8, refreshed: seven("a"), err: context.Canceled}, [3]bool{false, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := tc.res.rows()
			for i, r := range rows {
				if r.Matched != tc.want[i] {
					t.Errorf("row %q matched = %v, want %v (ours: %s)", r.Experiment, r.Matched, tc.want[i], r.Ours)
				}
			}
		})
	}
}

func TestShellJoinQuotesWhatAShellWouldSplit(t *testing.T) {
	got := shellJoin([]string{"--manifests", "/tmp/a b", "--healthz-bind-address", "", "--iptables=false"})
	want := `--manifests "/tmp/a b" --healthz-bind-address "" --iptables=false`
	if got != want {
		t.Errorf("shellJoin = %s, want %s", got, want)
	}
}
