package e2e

import (
	"net/netip"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// checkSourceRanges: a LoadBalancer Service whose loadBalancerSourceRanges
// hold pod1's subnet only serves its LB IP to pod1 (TCP and UDP) and drops
// the external host's and pod2's connections to it, while its ClusterIP, on
// the same proxy socket, still serves pod2.
func checkSourceRanges(t *testing.T, e *env) {
	s := e.svcs["ranges"]
	lb := netip.MustParseAddr(s.lbIP)
	for _, tc := range []struct {
		what   string
		cl     harness.Client
		proto  string
		dst    netip.AddrPort
		served bool
	}{
		{"LB IP from pod1, in range", e.pod1(ipRR), "tcp", netip.AddrPortFrom(lb, httpPort), true},
		{"LB IP UDP from pod1, in range", e.pod1(ipRR), "udp", netip.AddrPortFrom(lb, dnsPort), true},
		{"LB IP from outside, not in range", e.external(), "tcp", netip.AddrPortFrom(lb, httpPort), false},
		{"LB IP UDP from outside, not in range", e.external(), "udp", netip.AddrPortFrom(lb, dnsPort), false},
		{"LB IP from pod2, not in range", e.pod2(ipRR), "tcp", netip.AddrPortFrom(lb, httpPort), false},
		{"ClusterIP from pod2", e.pod2(ipRR), "tcp", s.tcp(), true},
	} {
		answer, err := direct(tc.cl, tc.proto, tc.dst)
		figure(t, "source ranges: %s: %s %s from %s: answer %q, err %v", tc.what, tc.proto, tc.dst, tc.cl.Label, answer, err)
		if served := err == nil; served != tc.served {
			t.Errorf("%s (%s %s from %s): served=%v (answer %q, err %v), want %v", tc.what, tc.proto, tc.dst, tc.cl.Label, served, answer, err, tc.served)
		}
	}
}
