package e2ecp

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// checkFaultsInvalid creates a Service already declaring latency 300 ms, then turns
// its faults annotation invalid (a toxic of an unknown type) through the API server,
// which stores any annotation: the proxy logs an error (printed at any -v) naming the
// Service and the field, the previous latency keeps applying however long the bad
// value stays, and the next valid value (reset_peer) takes effect as usual.
func checkFaultsInvalid(t *testing.T, e *env) {
	ns := e.cp.Namespace(t)
	pod := e.pod(ipFaultsInvalid)
	s := newService(ns, "stubborn", 80, 53)
	s.Annotations = map[string]string{faultsAnnotation: latencyFaults}
	svc, _ := createService(t, e.admin, s, readyEndpoints(e.backendIPs(1)...))
	dst := servicePort(t, svc, tcpPortName)
	delayedIn := pod.WaitFor(t, "tcp", dst, time.Now(), changePatience, "served and delayed by the latency toxic", delayed)
	base := timedAsks(t, pod, dst, 1)

	time.Sleep(faultQuiet)
	setFaults(t, e, svc, unknownFaults)
	var kept []time.Duration
	for stored := time.Now(); time.Since(stored) < faultWindow; {
		kept = append(kept, timedAsks(t, pod, dst, 1)...)
	}
	if least := slices.Min(kept); least < latencyAdded {
		t.Errorf("tcp %s: a request took %v after the annotation turned invalid: the last valid latency toxic was dropped (all: %s)",
			dst, least, ms(kept))
	}
	want := []string{ns + "/" + svc.Name, "metadata.annotations[" + faultsAnnotation + "]", "[0].type", "explode"}
	var reported []string
	for _, line := range e.proxy.LogLines("explode") {
		// klog's severity letter: E lines are printed at -v=0 too.
		if strings.HasPrefix(line, "E") && containsAll(line, want) {
			reported = append(reported, line)
		}
	}
	if len(reported) == 0 {
		t.Errorf("no error line names all of %q; lines about it:\n%s", want, strings.Join(e.proxy.LogLines("explode", svc.Name), "\n"))
	}

	resetIn := annotateFaults(t, e, svc, resetFaults, pod, dst, "reset (ECONNRESET) by the next valid toxic", reset)
	first := ""
	if len(reported) > 0 {
		first = reported[0]
	}
	t.Logf("FIGURE faults annotation invalid via the API server: latency seen %d ms after create (a probe waits 100 ms); kept for %v (%d requests, %s; before: %s); %d error line(s): %s; next valid value (reset_peer) live %d ms after the update",
		delayedIn.Milliseconds(), faultWindow, len(kept), ms(kept), ms(base), len(reported), strings.TrimSpace(first), resetIn.Milliseconds())
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
