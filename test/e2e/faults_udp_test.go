package e2e

import (
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// lossProbes is how many datagrams must all go unanswered while loss 1.0 is declared.
const lossProbes = 20

// checkFaultsUDPLoss: loss 1.0 on a Service's UDP port drops every datagram sent
// through the ClusterIP while its TCP port serves as before; without the annotation
// the UDP port answers again.
func checkFaultsUDPLoss(t *testing.T, e *env) {
	s := e.svcs["lossy"]
	cl := e.pod1(ipFaultUDP)
	cl.MustAsk(t, "udp", s.udp())

	before := injected(t, e, s.portName("dns"), "drop")
	s.faults = lossFaults
	lostIn := rewriteFaults(t, e, s, cl, "udp", "losing every datagram", unanswered)
	var answered int
	for range lossProbes {
		if _, err := cl.Ask("udp", s.udp(), harness.PollTimeout); err == nil {
			answered++
		}
	}
	if answered > 0 {
		t.Errorf("udp %s: %d of %d datagrams answered under loss 1.0", s.udp(), answered, lossProbes)
	}
	dropped := injected(t, e, s.portName("dns"), "drop") - before
	if dropped < lossProbes+1 {
		t.Errorf("faults_injected_total{toxic=\"drop\"} grew by %.0f over at least %d lost datagrams", dropped, lossProbes+1)
	}
	if name := cl.MustAsk(t, "tcp", s.tcp()); name != "b1" {
		t.Errorf("tcp %s under a UDP loss toxic: answered by %q, want b1", s.tcp(), name)
	}

	s.faults = ""
	backIn := rewriteFaults(t, e, s, cl, "udp", "answered by b1 once the annotation is removed", answeredBy("b1"))
	figure(t, "faults UDP loss 1.0 via the manifest: datagrams lost %d ms after the change, %d of %d answered, %.0f drops counted, TCP unaffected; answers again %d ms after removal",
		lostIn.Milliseconds(), answered, lossProbes, dropped, backIn.Milliseconds())
}
