package e2e

import (
	"slices"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// checkEvenSplit asks dst distConns times and wants exactly 10/10/10 over
// three backends: the legacy round robin, one new connection at a time.
func checkEvenSplit(t *testing.T, cl harness.Client, proto string, s svc) {
	t.Helper()
	dst := s.tcp()
	if proto == "udp" {
		dst = s.udp()
	}
	got, err := distribution(cl, proto, dst, distConns)
	figure(t, "round robin %s %s from %s over %d new connections: %s", proto, dst, cl.Label, distConns, got)
	if err != nil {
		t.Errorf("%s %s from %s: %d of %d failed, first: %v", proto, dst, cl.Label, got["ERR"], distConns, err)
	}
	if want := []int{10, 10, 10}; !slices.Equal(got.sorted(), want) {
		t.Errorf("%s %s from %s: distribution %s, want 10/10/10 over 3 backends", proto, dst, cl.Label, got)
	}
}

// checkRoundRobinFromPod: pod traffic enters the node's PREROUTING, TCP and
// UDP (UDP replies must come from ClusterIP:port; ask checks that).
func checkRoundRobinFromPod(t *testing.T, e *env) {
	for _, proto := range []string{"tcp", "udp"} {
		checkEvenSplit(t, e.pod1(ipRR), proto, e.svcs["rr"])
	}
	checkEvenSplit(t, e.pod2(ipRR), "tcp", e.svcs["rr"])
}

// checkRoundRobinFromNode: the node's own traffic goes through OUTPUT.
func checkRoundRobinFromNode(t *testing.T, e *env) {
	for _, proto := range []string{"tcp", "udp"} {
		checkEvenSplit(t, e.node(), proto, e.svcs["rrnode"])
	}
}

// checkDeadEndpoint: one endpoint is listed but nothing listens there; every
// connection must still be served, by the live ones, without the client
// noticing.
func checkDeadEndpoint(t *testing.T, e *env) {
	cl := e.pod1(ipRR)
	s := e.svcs["dead"]
	failures := e.p.Metric(t, "kubeproxy_userspace_dial_failures_total")
	got, err := distribution(cl, "tcp", s.tcp(), distConns)
	failures = e.p.Metric(t, "kubeproxy_userspace_dial_failures_total") - failures
	figure(t, "dead endpoint %s listed with 3 live: %d connections from %s: %s; dial failures retried: %.0f",
		e.c.DeadIP, distConns, cl.Label, got, failures)
	if failures < 1 {
		t.Errorf("dial_failures_total did not grow: the dead endpoint was never tried, so the retry is unproven")
	}
	if err != nil {
		t.Errorf("tcp %s: %d of %d failed although 3 endpoints are alive, first: %v", s.tcp(), got["ERR"], distConns, err)
	}
	for name := range got {
		if name != "ERR" && !slices.Contains([]string{"b1", "b2", "b3"}, name) {
			t.Errorf("answer from unexpected backend %q", name)
		}
	}
	if len(got.sorted()) != 3 {
		t.Errorf("want all 3 live backends used, got %s", got)
	}
}
