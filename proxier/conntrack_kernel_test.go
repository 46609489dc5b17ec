package proxier

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// TestKernelEarlySYNDoesNotOutliveThePortal, in a namespace of its own with
// real iptables and conntrack: a SYN sent to a ClusterIP before its portal
// exists leaves an un-NATed SYN_SENT entry (120 s). Once the portal is in,
// a connection from the same source port must reach the proxy socket.
func TestKernelEarlySYNDoesNotOutliveThePortal(t *testing.T) {
	ns, p, sync := conntrackBed(t, "ct")
	nodeIP := conntrackNodeIP

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

var conntrackNodeIP = netip.MustParseAddr("10.200.0.1")

// conntrackBed is a namespace with real iptables and conntrack whose node
// address is conntrackNodeIP and which routes 10.96.0.0/16 out of a veth,
// a proxier with its portals there, and sync, which runs a sync in it.
// Another Service is served already, as on any live node (its guard rule
// is what turns conntrack on in a fresh namespace).
func conntrackBed(t *testing.T, name string) (*netns.NS, *Proxier, func()) {
	t.Helper()
	netns.Require(t, "iptables", "iptables-save", "iptables-restore")
	ns := netns.New(t).NS(name)
	ns.MustIP("link", "add", "kup0", "type", "veth", "peer", "name", "kup1")
	ns.MustIP("addr", "add", conntrackNodeIP.String()+"/24", "dev", "kup0")
	ns.MustIP("link", "set", "kup0", "up")
	ns.MustIP("link", "set", "kup1", "up")
	ns.MustIP("route", "add", "10.96.0.0/16", "dev", "kup0")

	p, sync := bedProxier(t, ns, PortRange{})
	p.OnServiceAdd(makeService("other", withClusterIP("10.96.0.20")))
	sync()
	return ns, p, sync
}

// bedProxier is a proxier of conntrackBed's namespace ns taking its proxy
// ports from ports, its sources synced, and sync, which runs a sync in ns.
func bedProxier(t *testing.T, ns *netns.NS, ports PortRange) (*Proxier, func()) {
	t.Helper()
	var runner iptables.Runner
	if err := ns.Do(func() (err error) { runner, err = iptables.NewRunner(iptables.IPv4); return err }); err != nil {
		t.Skipf("iptables: %v", err)
	}
	p := New(Options{
		IPv4Portals: iptables.New(runner, iptables.Config{Family: iptables.IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: conntrackNodeIP}),
		BindAddress: netip.IPv4Unspecified(),
		Conntrack:   NetlinkConntrack{},
		PortRange:   ports,
	})
	t.Cleanup(func() { stopBedProxier(p) })
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	sync := func() {
		t.Helper()
		if err := ns.Do(func() error { p.Sync(); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	return p, sync
}

// stopBedProxier closes p's proxy sockets (its rules stay, as a stopped
// proxy leaves them).
func stopBedProxier(p *Proxier) {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	for name, ap := range p.active {
		p.closePort(name, ap)
	}
}

// TestKernelResetConnectionDoesNotRefuseTheNextProxy, in a namespace of its
// own with real iptables and conntrack: a connection reset through a
// portal (the proxy resets every connection at SIGTERM; here web has no
// endpoints, which resets it at once) leaves an entry in CLOSE NATed to
// that proxy's port for 10 s, and the kernel sends a new SYN from the same
// source port to that port again rather than through the portal. A next
// proxy listening on another port (an overlap, a taken port, another
// --proxy-port-range) must still be reached from that source port: before,
// it was refused (ECONNREFUSED) while a connection from another port was
// served.
func TestKernelResetConnectionDoesNotRefuseTheNextProxy(t *testing.T) {
	ns, p, sync := conntrackBed(t, "ctr")
	p.OnServiceAdd(makeService("web"))
	sync()
	// connect dials the ClusterIP from srcPort: a reset is as good as a
	// connection (web has no endpoints); a refusal is not.
	connect := func(srcPort int) error {
		return ns.Do(func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: conntrackNodeIP.AsSlice(), Port: srcPort}, Timeout: time.Second}
			c, err := d.Dial("tcp4", "10.96.0.10:80")
			if err == nil {
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				_, err = c.Read(make([]byte, 1))
				c.Close()
			}
			if errors.Is(err, unix.ECONNRESET) || errors.Is(err, io.EOF) {
				return nil
			}
			return err
		})
	}
	if err := connect(50000); err != nil {
		t.Fatalf("through the first proxy's portal: %v", err)
	}
	oldPort := p.active[servicePortName("web")].proxyPort
	stopBedProxier(p)

	// The next proxy, on ports that exclude the last one's.
	next, nextSync := bedProxier(t, ns, PortRange{Base: oldPort%60000 + 1, Size: 1000})
	next.OnServiceAdd(makeService("other", withClusterIP("10.96.0.20")))
	next.OnServiceAdd(makeService("web"))
	nextSync()
	if got := next.active[servicePortName("web")].proxyPort; got == oldPort {
		t.Fatalf("the next proxy listens on the same port %d: the scenario is not reproduced", got)
	}
	if err := connect(50001); err != nil {
		t.Fatalf("from a fresh source port, through the next proxy's portal: %v", err)
	}
	if err := connect(50000); err != nil {
		t.Fatalf("from the reset connection's source port, through the next proxy's portal: %v", err)
	}
}

func unNATedEntries(t *testing.T, ns *netns.NS) int {
	t.Helper()
	var filter staleSet
	filter.add(StaleFlows{Protocol: v1.ProtocolTCP, Dst: netip.MustParseAddrPort("10.96.0.10:80")})
	n := 0
	err := ns.Do(func() error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		for _, f := range flows {
			// The filter also takes reset connections NATed elsewhere.
			if filter.MatchConntrackFlow(f) && f.Reverse.SrcPort == f.Forward.DstPort {
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

// TestKernelUDPClearingSparesLiveFlows, in a namespace of its own with real
// iptables and conntrack: a new UDP socket's stale entries are cleared
// after the sync that wrote its portal, and by then clients may already
// be relayed through that portal (make bench's first UDP run lost 34-52
// replies this way: their entry was deleted under them). The clearing must
// take the un-NATed entry of a datagram sent before the portal existed and
// leave the entry of a flow that reaches the proxy socket.
func TestKernelUDPClearingSparesLiveFlows(t *testing.T) {
	ns, p, sync := conntrackBed(t, "ctu")
	nodeIP := conntrackNodeIP
	// The backend is on the test's own loopback: the proxy's service socket
	// is made in the namespace (by Sync, below), but it dials backends from
	// its relay goroutine, whose thread is in the test's namespace.
	backend := loopbackUDPEcho(t)

	service := netip.MustParseAddrPort("10.96.0.10:80")
	dial := func() *net.UDPConn {
		t.Helper()
		c, err := ns.ListenUDP(nodeIP)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	exchange := func(c *net.UDPConn) error {
		if _, err := c.WriteToUDPAddrPort([]byte("ping"), service); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 64)
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err == nil && (from != service || string(buf[:n]) != "ping") {
			err = fmt.Errorf("answer %q from %v", buf[:n], from)
		}
		return err
	}
	early := dial()
	if err := exchange(early); err == nil {
		t.Fatal("answered before the portal existed")
	}
	if n := udpEntries(t, ns, early, nil); n != 1 {
		t.Fatalf("%d entries for the early datagram, want 1: the scenario is not reproduced", n)
	}

	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, backend.LocalAddr().String()))
	sync()
	if n := udpEntries(t, ns, early, nil); n != 0 {
		t.Errorf("the early datagram's un-NATed entry outlived the portal (%d)", n)
	}
	live := dial()
	if err := exchange(live); err != nil {
		t.Fatalf("through the portal: %v", err)
	}
	name := servicePortName("dns")
	name.Protocol = v1.ProtocolUDP
	ap := p.active[name]
	if n := udpEntries(t, ns, live, &ap.proxyPort); n != 1 {
		t.Fatalf("%d entries of the relayed flow NATed to the proxy port, want 1", n)
	}
	// The clearing that follows a sync, once more, with the flow in swing.
	p.staleFlowsToClear(name)
	if err := ns.Do(func() error { p.clearStaleFlows(bothFamilies); return nil }); err != nil {
		t.Fatal(err)
	}
	if n := udpEntries(t, ns, live, &ap.proxyPort); n != 1 {
		t.Errorf("the clearing deleted the entry of a flow relayed through the portal")
	}
	if err := exchange(live); err != nil {
		t.Errorf("after the clearing: %v", err)
	}
}

// TestKernelDeletedUDPServiceClearsItsFlows, in a namespace of its own with
// real iptables and conntrack: a client relayed through a UDP Service's
// portal holds an entry NATed to its proxy port, which each datagram from
// the same source port refreshes. Once the Service is deleted and its
// rules are gone, the entry must be too, or the client keeps sending to a
// closed port (or to the next socket given that port).
func TestKernelDeletedUDPServiceClearsItsFlows(t *testing.T) {
	ns, p, sync := conntrackBed(t, "ctd")
	backend := loopbackUDPEcho(t)
	svc := makeService("dns", withProtocol(v1.ProtocolUDP))
	p.OnServiceAdd(svc)
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, backend.LocalAddr().String()))
	sync()

	c, err := ns.ListenUDP(conntrackNodeIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	service := netip.MustParseAddrPort("10.96.0.10:80")
	if _, err := c.WriteToUDPAddrPort([]byte("ping"), service); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, _, err := c.ReadFromUDPAddrPort(make([]byte, 64)); err != nil {
		t.Fatalf("through the portal: %v", err)
	}
	name := servicePortName("dns")
	name.Protocol = v1.ProtocolUDP
	proxyPort := p.active[name].proxyPort
	if n := udpEntries(t, ns, c, &proxyPort); n != 1 {
		t.Fatalf("%d entries of the relayed flow NATed to the proxy port, want 1", n)
	}

	p.OnServiceDelete(svc)
	sync()
	if n := udpEntries(t, ns, c, nil); n != 0 {
		t.Errorf("%d entries of the deleted Service's client outlived its rules", n)
	}
}

// TestKernelRemovedExternalIPClearsItsFlows, in a namespace of its own with
// real iptables and conntrack: a client relayed through a UDP Service's
// external IP holds an entry NATed to the port's proxy socket. Once the
// external IP is removed from the Service (the port, and its socket, stay)
// and its portal is gone, the entry must be too, or the client that keeps
// its source port keeps being served at an address the Service gave up.
func TestKernelRemovedExternalIPClearsItsFlows(t *testing.T) {
	ns, p, sync := conntrackBed(t, "ctx")
	backend := loopbackUDPEcho(t)
	svc := makeService("dns", withProtocol(v1.ProtocolUDP))
	svc.Spec.ExternalIPs = []string{"10.96.1.10"}
	p.OnServiceAdd(svc)
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, backend.LocalAddr().String()))
	sync()

	c, err := ns.ListenUDP(conntrackNodeIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.WriteToUDPAddrPort([]byte("ping"), netip.MustParseAddrPort("10.96.1.10:80")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, _, err := c.ReadFromUDPAddrPort(make([]byte, 64)); err != nil {
		t.Fatalf("through the external IP's portal: %v", err)
	}
	name := servicePortName("dns")
	name.Protocol = v1.ProtocolUDP
	proxyPort := p.active[name].proxyPort
	if n := udpEntries(t, ns, c, &proxyPort); n != 1 {
		t.Fatalf("%d entries of the relayed flow NATed to the proxy port, want 1", n)
	}

	p.OnServiceUpdate(svc, makeService("dns", withProtocol(v1.ProtocolUDP)))
	sync()
	if p.active[name] == nil || p.active[name].proxyPort != proxyPort {
		t.Fatal("the service port's socket did not stay")
	}
	if n := udpEntries(t, ns, c, nil); n != 0 {
		t.Errorf("%d entries of the client of the removed external IP outlived its portal", n)
	}
}

// udpEntries counts the UDP conntrack entries of c's datagrams to
// 10.96.0.10:80; with natTo, only those NATed to that port.
func udpEntries(t *testing.T, ns *netns.NS, c *net.UDPConn, natTo *int) int {
	t.Helper()
	src := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	n := 0
	err := ns.Do(func() error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		for _, f := range flows {
			if f.Forward.Protocol != unix.IPPROTO_UDP || f.Forward.SrcPort != src || f.Forward.DstPort != 80 {
				continue
			}
			if natTo == nil || int(f.Reverse.SrcPort) == *natTo {
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

// loopbackUDPEcho is a UDP backend on 127.0.0.1 that echoes every
// datagram, closed with the test.
func loopbackUDPEcho(t *testing.T) *net.UDPConn {
	backend, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := backend.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = backend.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return backend
}
