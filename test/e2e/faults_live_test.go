package e2e

import (
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// checkFaultsLive rewrites a Service's faults annotation in its manifest while a pod
// asks through the ClusterIP: latency 300 ms delays every answer, TCP and UDP (the
// toxic names no port), by at least 300 ms and the fastest by less than 600 ms; reset_peer then
// resets every TCP connection and leaves UDP alone; without the annotation the Service
// answers as fast as before. Each change must be live within faultBudget.
func checkFaultsLive(t *testing.T, e *env) {
	s := e.svcs["faulty"]
	cl := e.pod1(ipFaultLive)
	baseTCP := timedAsks(t, cl, "tcp", s.tcp(), faultSamples)
	baseUDP := timedAsks(t, cl, "udp", s.udp(), faultSamples)

	s.faults = latencyFaults
	slowIn := rewriteFaults(t, e, s, cl, "tcp", "delayed past the poll timeout by the latency toxic", delayed)
	slowTCP := timedAsks(t, cl, "tcp", s.tcp(), faultSamples)
	slowUDP := timedAsks(t, cl, "udp", s.udp(), faultSamples)
	addedTCP := checkAdded(t, "tcp "+s.tcp().String(), baseTCP, slowTCP)
	addedUDP := checkAdded(t, "udp "+s.udp().String(), baseUDP, slowUDP)
	checkDeclared(t, e, map[string][]string{s.portName("http"): {"slow/annotation"}, s.portName("dns"): {"slow/annotation"}})
	figure(t, "faults latency 300 ms via the manifest: seen %d ms after the change (a probe waits 100 ms for its answer); TCP %s (without: %s), +%d ms median; UDP %s (without: %s), +%d ms median",
		slowIn.Milliseconds(), ms(slowTCP), ms(baseTCP), addedTCP.Milliseconds(), ms(slowUDP), ms(baseUDP), addedUDP.Milliseconds())

	before := injected(t, e, s.portName("http"), "cut")
	s.faults = resetFaults
	resetIn := rewriteFaults(t, e, s, cl, "tcp", "reset (ECONNRESET) by the reset_peer toxic", reset)
	for i := range faultSamples {
		if name, err := cl.Ask("tcp", s.tcp(), harness.AnswerTimeout); !reset(name, err) {
			t.Errorf("tcp %s, request %d after reset_peer was live: %q, %v; want ECONNRESET", s.tcp(), i+1, name, err)
		}
	}
	cuts := injected(t, e, s.portName("http"), "cut") - before
	if cuts < faultSamples+1 {
		t.Errorf("faults_injected_total{toxic=\"cut\"} grew by %.0f over at least %d reset connections", cuts, faultSamples+1)
	}
	checkDeclared(t, e, map[string][]string{s.portName("http"): {"cut/annotation"}, s.portName("dns"): {}})
	udpDuringReset := median(timedAsks(t, cl, "udp", s.udp(), faultSamples))
	if udpDuringReset >= latencyAdded {
		t.Errorf("udp %s: median %v while only reset_peer (TCP) is declared: the latency toxic was not removed", s.udp(), udpDuringReset)
	}
	figure(t, "faults reset_peer via the manifest: connections reset (ECONNRESET) %d ms after the change; %.0f resets counted; UDP median %d ms meanwhile",
		resetIn.Milliseconds(), cuts, udpDuringReset.Milliseconds())

	s.faults = ""
	normalIn := rewriteFaults(t, e, s, cl, "tcp", "answered by b1 once the annotation is removed", answeredBy("b1"))
	afterTCP := timedAsks(t, cl, "tcp", s.tcp(), faultSamples)
	checkDeclared(t, e, map[string][]string{s.portName("http"): {}, s.portName("dns"): {}})
	afterUDP := timedAsks(t, cl, "udp", s.udp(), faultSamples)
	for _, d := range append(afterTCP, afterUDP...) {
		if d >= latencyAdded {
			t.Errorf("a request took %v after the annotation was removed (TCP %s, UDP %s)", d, ms(afterTCP), ms(afterUDP))
			break
		}
	}
	figure(t, "faults annotation removed: normal service %d ms after the change; TCP %s, UDP %s",
		normalIn.Milliseconds(), ms(afterTCP), ms(afterUDP))
}
