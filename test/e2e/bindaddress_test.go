package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// TestBindAddressAndPortRange: with --bind-address naming one node address
// (the external link's, not the default route's) and --proxy-port-range,
// every portal, from PREROUTING and from OUTPUT alike, DNATs to that address
// and a port of the range, the proxy sockets listen there, and ClusterIP,
// externalIP, LB ingress IP and NodePort traffic, TCP and UDP, is served from
// a pod, from the node and from the external host. The other suites run with
// --bind-address 0.0.0.0 and without --proxy-port-range.
func TestBindAddressAndPortRange(t *testing.T) {
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 3, ClientIPsEach: 1})
	c.StartBackends(t, backendBin, backendPort)
	const first, last = 40100, 40109
	bind := c.NodeExternalIP
	p := newProxy(t, c, "--bind-address", bind.String(), "--proxy-port-range", fmt.Sprintf("%d-%d", first, last))
	s := svc{name: "bound", clusterIP: "10.96.0.140", endpoints: ips(c, 0, 1, 2), nodePorts: [2]int32{30140, 30141},
		externalIPs: []string{"10.77.50.40"}, lbIP: "10.77.60.40"}
	writeSvc(t, p.dir, s)
	p.Start(t, startWithin)
	e := &env{c: c, p: p}
	pod := harness.Client{Label: "pod1", NS: c.Pod1, Src: c.Pod1IPs[0]}
	pod.WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
	pod.WaitServed(t, "udp", s.udp(), time.Now(), startBudget)

	inRange := func(ap netip.AddrPort) bool {
		return ap.Addr() == bind && ap.Port() >= first && ap.Port() <= last
	}
	for _, port := range []string{"http", "dns"} {
		name := s.portName(port)
		addr, err := netip.ParseAddrPort(proxyAddressOf(t, e, name))
		if err != nil || !inRange(addr) {
			t.Errorf("%s listens on %v (%v), want %s:%d-%d", name, addr, err, bind, first, last)
		}
		rules := p.Rules(t, name)
		dnats := 0
		for _, r := range rules {
			_, to, ok := strings.Cut(r, "--to-destination ")
			if !ok {
				if strings.Contains(r, "-j REDIRECT") {
					t.Errorf("%s: REDIRECT with --bind-address %s, want DNAT to it: %s", name, bind, r)
				}
				continue
			}
			dnats++
			if ap, err := netip.ParseAddrPort(strings.Fields(to)[0]); err != nil || ap != addr {
				t.Errorf("%s: portal DNATs to %s, want its socket %s: %s", name, to, addr, r)
			}
		}
		// ClusterIP, externalIP and ingress IP from PREROUTING and OUTPUT,
		// and the NodePort from both.
		if dnats != 8 {
			t.Errorf("%s: %d DNAT portals, want 8:\n%s", name, dnats, strings.Join(rules, "\n"))
		}
	}

	np := func(ip netip.Addr, i int) netip.AddrPort { return netip.AddrPortFrom(ip, uint16(s.nodePorts[i])) }
	extIP, lbIP := netip.MustParseAddr(s.externalIPs[0]), netip.MustParseAddr(s.lbIP)
	node := harness.Client{Label: "node", NS: c.Node}
	external := harness.Client{Label: "external", NS: c.External}
	for _, cl := range []harness.Client{pod, node, external} {
		for _, tc := range []struct {
			what  string
			proto string
			dst   netip.AddrPort
		}{
			{"ClusterIP", "tcp", s.tcp()},
			{"ClusterIP", "udp", s.udp()},
			{"externalIP", "tcp", netip.AddrPortFrom(extIP, httpPort)},
			{"externalIP", "udp", netip.AddrPortFrom(extIP, dnsPort)},
			{"LB ingress IP", "tcp", netip.AddrPortFrom(lbIP, httpPort)},
			{"LB ingress IP", "udp", netip.AddrPortFrom(lbIP, dnsPort)},
			{"NodePort on the NodeIP", "tcp", np(c.NodeIP, 0)},
			{"NodePort on the NodeIP", "udp", np(c.NodeIP, 1)},
			{"NodePort on the bound address", "tcp", np(bind, 0)},
			{"NodePort on the bound address", "udp", np(bind, 1)},
		} {
			got, err := distribution(cl, tc.proto, tc.dst, 3)
			figure(t, "--bind-address %s: %s %s %s from %s: %s", bind, tc.what, tc.proto, tc.dst, cl.Label, got)
			if err != nil {
				t.Errorf("%s %s %s from %s: %v", tc.what, tc.proto, tc.dst, cl.Label, err)
			}
		}
	}
}
