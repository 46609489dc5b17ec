package e2ecp

import (
	"fmt"
	"testing"
	"time"
)

// servedBudget is how soon a new Service must be served once it and its EndpointSlice are
// stored (issue 4); waits give up at servedPatience, so a slow proxy is still measured.
const (
	servedBudget   = time.Second
	servedPatience = 10 * time.Second
	servedTrials   = 3
)

// checkServedWithin1s creates Services with their EndpointSlices, one at a time after an
// idle gap (so each is a first change after a quiet period, as in a cluster), and
// measures how soon a pod is answered over TCP and UDP through the ClusterIP.
func checkServedWithin1s(t *testing.T, e *env) {
	ns := e.cp.Namespace(t)
	pod := e.pod(ipServed)
	for i := range servedTrials {
		// Longer than --iptables-min-sync-period: the proxy (just started, for the first
		// Service) has synced and is idle, so the change is not held back by the rate limit.
		time.Sleep(1500 * time.Millisecond)
		began := time.Now()
		svc, _ := createService(t, e.admin, newService(ns, fmt.Sprintf("served-%d", i), 80, 53),
			readyEndpoints(e.backendIPs(0, 1)...))
		stored := time.Now()
		tcp := pod.WaitServed(t, "tcp", servicePort(t, svc, tcpPortName), stored, servedPatience)
		udp := pod.WaitServed(t, "udp", servicePort(t, svc, udpPortName), stored, servedPatience)
		t.Logf("FIGURE served %s/%s (%s): TCP %d ms, UDP %d ms after both objects were stored (creating them took %d ms)",
			ns, svc.Name, svc.Spec.ClusterIP, tcp.Milliseconds(), udp.Milliseconds(), stored.Sub(began).Milliseconds())
		if tcp > servedBudget || udp > servedBudget {
			t.Errorf("%s/%s: served after TCP %v, UDP %v; want within %v", ns, svc.Name, tcp, udp, servedBudget)
		}
	}
}
