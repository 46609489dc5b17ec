package proxier

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// TestKernelEarlySYNDoesNotOutliveThePortal, in a namespace of its own with
// real iptables and conntrack: a SYN sent to a ClusterIP before its portal
// exists leaves an un-NATed SYN_SENT entry (120 s). Once the portal is in,
// a connection from the same source port must reach the proxy socket.
func TestKernelEarlySYNDoesNotOutliveThePortal(t *testing.T) {
	netns.Require(t, "iptables", "iptables-save", "iptables-restore")
	ns := netns.New(t).NS("ct")
	ns.MustIP("link", "add", "kup0", "type", "veth", "peer", "name", "kup1")
	ns.MustIP("addr", "add", "10.200.0.1/24", "dev", "kup0")
	ns.MustIP("link", "set", "kup0", "up")
	ns.MustIP("link", "set", "kup1", "up")
	ns.MustIP("route", "add", "10.96.0.0/16", "dev", "kup0")

	var runner iptables.Runner
	if err := ns.Do(func() (err error) { runner, err = iptables.NewRunner(iptables.IPv4); return err }); err != nil {
		t.Skipf("iptables: %v", err)
	}
	nodeIP := netip.MustParseAddr("10.200.0.1")
	p := New(Options{
		IPv4Portals: iptables.New(runner, iptables.Config{Family: iptables.IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: nodeIP}),
		BindAddress: netip.IPv4Unspecified(),
		Conntrack:   NetlinkConntrack{},
	})
	t.Cleanup(func() {
		p.syncMu.Lock()
		defer p.syncMu.Unlock()
		for name, ap := range p.active {
			p.closePort(name, ap)
		}
	})
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	sync := func() {
		t.Helper()
		if err := ns.Do(func() error { p.Sync(); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	// Another Service is served already, as on any live node (its guard
	// rule is what turns conntrack on in a fresh namespace).
	p.OnServiceAdd(makeService("other", withClusterIP("10.96.0.20")))
	sync()

	client := &net.TCPAddr{IP: nodeIP.AsSlice(), Port: 45678}
	// connect reports whether the SYN reached a socket. web has no
	// endpoints, so the proxy socket accepts and then refuses with a reset,
	// which can beat the dialler's own look at the handshake: a reset is
	// as good as a connection here (an un-NATed SYN is never answered).
	connect := func() error {
		return ns.Do(func() error {
			d := net.Dialer{LocalAddr: client, Timeout: 500 * time.Millisecond}
			c, err := d.Dial("tcp4", "10.96.0.10:80")
			if err == nil {
				c.Close()
			}
			if errors.Is(err, unix.ECONNRESET) {
				return nil
			}
			return err
		})
	}
	if err := connect(); err == nil {
		t.Fatal("connected to the ClusterIP before its portal existed")
	}
	if n := unNATedEntries(t, ns); n == 0 {
		t.Fatal("the early SYN left no conntrack entry: the scenario is not reproduced")
	}

	p.OnServiceAdd(makeService("web"))
	sync()
	if err := connect(); err != nil {
		t.Fatalf("from the early SYN's source port, after the portal was added: %v", err)
	}
	if n := unNATedEntries(t, ns); n != 0 {
		t.Errorf("%d un-NATed entries to the ClusterIP remain", n)
	}
}

func unNATedEntries(t *testing.T, ns *netns.NS) int {
	t.Helper()
	filter := unNATedTCP{netip.MustParseAddrPort("10.96.0.10:80")}
	n := 0
	err := ns.Do(func() error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		for _, f := range flows {
			if filter.MatchConntrackFlow(f) {
				n++
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
