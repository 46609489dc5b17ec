package e2e

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// TestLocalhostNodePortsServeTheNodeOnly: --nodeport-addresses localhost
// keeps NodePorts for the node's own clients (127.0.0.1:NodePort). A host
// on the node's link that sends a packet to 127.0.0.1:NodePort at the
// node's MAC address (any neighbour can; so can a pod with CAP_NET_RAW)
// must not be served: the node, with route_localnet off, drops such a
// martian destination. The PREROUTING NodePort rule for 127.0.0.0/8 DNATed
// it to the node IP before routing looked at it, so every neighbour was
// served.
func TestLocalhostNodePortsServeTheNodeOnly(t *testing.T) {
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{ClientIPsEach: 1})
	c.StartBackends(t, backendBin, backendPort)
	p := newProxy(t, c, "--nodeport-addresses", "localhost")
	s := svc{name: "np", clusterIP: "10.96.0.10", endpoints: ips(c, 0, 1, 2), nodePorts: [2]int32{30080, 30053}}
	writeSvc(t, p.dir, s)
	p.Start(t, startWithin)
	e := &env{c: c}
	loopback := netip.MustParseAddrPort("127.0.0.1:30080")
	e.node().WaitServed(t, "tcp", loopback, time.Now(), startBudget)
	e.node().WaitServed(t, "udp", netip.AddrPortFrom(loopback.Addr(), 30053), time.Now(), startBudget)

	// The external host sends to 127.0.0.1 through the node: loopback
	// destinations routed out of its link (route_localnet on its side
	// only; the kernel's local rule moved below one for 127.0.0.1).
	x := c.External
	x.Sysctl("net.ipv4.conf.all.route_localnet", "1")
	x.Sysctl("net.ipv4.conf.eth0.route_localnet", "1")
	x.MustIP("rule", "add", "pref", "100", "lookup", "local")
	x.MustIP("rule", "del", "pref", "0")
	x.MustIP("rule", "add", "to", "127.0.0.1/32", "lookup", "100", "pref", "10")
	x.MustIP("route", "add", "127.0.0.1/32", "via", c.NodeExternalIP.String(), "dev", "eth0", "table", "100")
	neighbour := harness.Client{Label: "external", NS: x, Src: c.ExternalIP}
	for _, proto := range []string{"tcp", "udp"} {
		dst := loopback
		if proto == "udp" {
			dst = netip.AddrPortFrom(loopback.Addr(), 30053)
		}
		answer, err := neighbour.Ask(proto, dst, time.Second)
		figure(t, "%s %s from a neighbour through the node: %q, %v", proto, dst, answer, err)
		if err == nil {
			t.Errorf("%s to %s from a host on the node's link was served by %q; --nodeport-addresses localhost serves the node only", proto, dst, answer)
		}
	}
	// The node's own clients are still served there.
	e.node().MustAsk(t, "tcp", loopback)
}
