package e2ecp

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// The faults annotation (issue 8) and the toxics the checks declare with it, in
// Toxiproxy's JSON shape; latencyFaults is the issue's own example.
const (
	faultsAnnotation = "kube-userspace-proxy/faults"
	latencyFaults    = `[{"name":"slow","type":"latency","stream":"downstream","toxicity":1.0,"attributes":{"latency":300,"jitter":0}}]`
	resetFaults      = `[{"name":"cut","type":"reset_peer","stream":"downstream","toxicity":1.0,"attributes":{"timeout":0}}]`
	unknownFaults    = `[{"name":"boom","type":"explode","toxicity":1.0}]`
)

const (
	// latencyAdded is what latencyFaults adds to every answer; a request through it
	// must be at least that much slower, and less than latencyCeiling slower.
	latencyAdded   = 300 * time.Millisecond
	latencyCeiling = 600 * time.Millisecond
	faultSamples   = 5 // requests per timing
	// faultQuiet is the pause before each change: longer than
	// --iptables-min-sync-period, so that the figure is the change's own path (watch,
	// sync, fault table) and not the rate limit's wait.
	faultQuiet = 1500 * time.Millisecond
	// faultBudget is the "live within 1 s of the change"; waits give up at
	// changePatience, so a slow change is still measured.
	faultBudget = time.Second
	// faultWindow is how long a check keeps asking after a change that must not take
	// effect: longer than a watch event and a rate-limited sync.
	faultWindow = 1500 * time.Millisecond
)

// annotateFaults sets the Service's faults annotation (empty: removes it) after
// faultQuiet, and waits until pod's TCP requests to dst show ok; it returns how long
// after the update was stored that took, and reports an error over faultBudget.
func annotateFaults(t *testing.T, e *env, svc *v1.Service, faults string, pod harness.Client, dst netip.AddrPort,
	what string, ok func(string, error) bool) time.Duration {
	t.Helper()
	time.Sleep(faultQuiet)
	setFaults(t, e, svc, faults)
	took := pod.WaitFor(t, "tcp", dst, time.Now(), changePatience, what, ok)
	if took > faultBudget {
		t.Errorf("tcp %s: %s only %v after the Service update; budget %v", dst, what, took, faultBudget)
	}
	return took
}

// setFaults writes the Service's faults annotation (empty: removes it).
func setFaults(t *testing.T, e *env, svc *v1.Service, faults string) {
	t.Helper()
	updateService(t, e.admin, svc.Namespace, svc.Name, func(s *v1.Service) {
		if faults == "" {
			delete(s.Annotations, faultsAnnotation)
			return
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[faultsAnnotation] = faults
	})
}

// Outcomes of a poll (harness.PollTimeout per request) that tell a fault is in force.
// delayed is a connection made (through the portal and the proxy's accept) whose
// answer did not come in time; a dial that times out is no proof of anything.
func delayed(_ string, err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "read" && op.Timeout()
}
func reset(_ string, err error) bool  { return errors.Is(err, syscall.ECONNRESET) }
func served(_ string, err error) bool { return err == nil }

// timedAsks asks dst over TCP n times and returns how long each answer took; any
// failure fails t.
func timedAsks(t *testing.T, pod harness.Client, dst netip.AddrPort, n int) []time.Duration {
	t.Helper()
	out := make([]time.Duration, n)
	for i := range out {
		began := time.Now()
		if _, err := pod.Ask("tcp", dst, harness.AnswerTimeout); err != nil {
			t.Fatalf("tcp %s from %s, request %d: %v", dst, pod, i+1, err)
		}
		out[i] = time.Since(began)
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// ms renders durations as whole milliseconds, for figures.
func ms(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = strconv.FormatInt(d.Milliseconds(), 10)
	}
	return strings.Join(parts, "/") + " ms"
}

// checkDelayed wants every request of slow to take at least latencyAdded (a latency
// toxic cannot make one faster) and slow's median less than latencyCeiling above
// base's; it returns the median added.
func checkDelayed(t *testing.T, dst netip.AddrPort, base, slow []time.Duration) time.Duration {
	t.Helper()
	added := median(slow) - median(base)
	if least := slices.Min(slow); least < latencyAdded {
		t.Errorf("tcp %s: a request took %v with a %v latency toxic (all: %s)", dst, least, latencyAdded, ms(slow))
	}
	if added >= latencyCeiling {
		t.Errorf("tcp %s: the toxic added %v (median %v against %v without it); want less than %v",
			dst, added, median(slow), median(base), latencyCeiling)
	}
	return added
}

// checkFaultsLive creates a Service, then annotates it through the API server while a
// pod asks through its ClusterIP: latency 300 ms delays every answer by at least
// 300 ms and less than 600 ms, reset_peer then resets every connection, and without
// the annotation the Service answers as fast as before; each live within faultBudget
// of the update.
func checkFaultsLive(t *testing.T, e *env) {
	ns := e.cp.Namespace(t)
	pod := e.pod(ipFaults)
	svc, _ := createService(t, e.admin, newService(ns, "faulty", 80, 53), readyEndpoints(e.backendIPs(0)...))
	dst := servicePort(t, svc, tcpPortName)
	pod.WaitServed(t, "tcp", dst, time.Now(), changePatience)
	base := timedAsks(t, pod, dst, faultSamples)

	slowIn := annotateFaults(t, e, svc, latencyFaults, pod, dst, "delayed past the poll timeout by the latency toxic", delayed)
	slow := timedAsks(t, pod, dst, faultSamples)
	added := checkDelayed(t, dst, base, slow)
	t.Logf("FIGURE faults latency 300 ms via the API server: seen %d ms after the update (a probe waits 100 ms for its answer); %s (without: %s), +%d ms median",
		slowIn.Milliseconds(), ms(slow), ms(base), added.Milliseconds())

	resetIn := annotateFaults(t, e, svc, resetFaults, pod, dst, "reset (ECONNRESET) by the reset_peer toxic", reset)
	resets := 0
	for i := range faultSamples {
		name, err := pod.Ask("tcp", dst, harness.AnswerTimeout)
		if !reset(name, err) {
			t.Errorf("tcp %s, request %d after reset_peer was live: %q, %v; want ECONNRESET", dst, i+1, name, err)
			continue
		}
		resets++
	}
	pod.MustAsk(t, "udp", servicePort(t, svc, udpPortName)) // reset_peer is TCP's only

	normalIn := annotateFaults(t, e, svc, "", pod, dst, "served once the annotation is removed", served)
	after := timedAsks(t, pod, dst, faultSamples)
	if slices.Max(after) >= latencyAdded {
		t.Errorf("tcp %s: requests took %s after the annotation was removed", dst, ms(after))
	}
	t.Logf("FIGURE faults via the API server: reset_peer live %d ms after the update (then %d of %d requests reset); annotation removed, normal service %d ms after the update (%s)",
		resetIn.Milliseconds(), resets, faultSamples, normalIn.Milliseconds(), ms(after))
}
