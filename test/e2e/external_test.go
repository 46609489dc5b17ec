package e2e

import (
	"net/netip"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// checkExternal: a LoadBalancer Service with NodePorts, an externalIP and an
// ingress IP is reachable through every one of them, TCP and UDP, from the
// external host, from a pod and from the node itself. UDP answers must come
// from the address the client sent to.
func checkExternal(t *testing.T, e *env) {
	s := e.svcs["ext"]
	extIP := netip.MustParseAddr(s.externalIPs[0])
	lbIP := netip.MustParseAddr(s.lbIP)
	np := func(ip netip.Addr, i int) netip.AddrPort { return netip.AddrPortFrom(ip, uint16(s.nodePorts[i])) }
	cases := []struct {
		what  string
		cl    harness.Client
		proto string
		dst   netip.AddrPort
	}{
		{"NodePort on the node's external-link IP", e.external(), "tcp", np(e.c.NodeExternalIP, 0)},
		{"NodePort on the NodeIP", e.external(), "tcp", np(e.c.NodeIP, 0)},
		{"NodePort UDP", e.external(), "udp", np(e.c.NodeExternalIP, 1)},
		{"externalIP", e.external(), "tcp", netip.AddrPortFrom(extIP, httpPort)},
		{"externalIP UDP", e.external(), "udp", netip.AddrPortFrom(extIP, dnsPort)},
		{"LB ingress IP", e.external(), "tcp", netip.AddrPortFrom(lbIP, httpPort)},
		{"LB ingress IP UDP", e.external(), "udp", netip.AddrPortFrom(lbIP, dnsPort)},
		{"NodePort from a pod", e.pod1(ipRR), "tcp", np(e.c.NodePodIP[0], 0)},
		{"externalIP from a pod", e.pod1(ipRR), "tcp", netip.AddrPortFrom(extIP, httpPort)},
		{"NodePort from the node", e.node(), "tcp", np(e.c.NodeIP, 0)},
		{"NodePort UDP from the node", e.node(), "udp", np(e.c.NodeIP, 1)},
		{"externalIP from the node", e.node(), "tcp", netip.AddrPortFrom(extIP, httpPort)},
		{"LB ingress IP from the node", e.node(), "tcp", netip.AddrPortFrom(lbIP, httpPort)},
	}
	for _, tc := range cases {
		got, err := distribution(tc.cl, tc.proto, tc.dst, 3)
		figure(t, "%s: %s %s from %s: %s", tc.what, tc.proto, tc.dst, tc.cl.Label, got)
		if err != nil {
			t.Errorf("%s (%s %s from %s): %v", tc.what, tc.proto, tc.dst, tc.cl.Label, err)
		}
	}
}
