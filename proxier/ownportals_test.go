package proxier

import (
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// TestEndpointAtOwnPortalNotDialled: an endpoint that is one of the
// proxy's own portals (here the Service's own external IP and port) is
// never dialled: on a node the proxy's OUTPUT rules send that dial back to
// its own socket as a new client, which dials it again, for ever (one UDP
// datagram, a session per hop; one TCP connect, two descriptors per hop
// until every Service was refused). The client is refused instead. The
// test's "portal" is a plain server at that address (no rules here): the
// proxy reached it before.
func TestEndpointAtOwnPortalNotDialled(t *testing.T) {
	for _, path := range []string{DataPathGoroutines, DataPathEventLoop} {
		t.Run("TCP "+path, func(t *testing.T) {
			b := startBackends(t, "127.0.0.53")[0]
			port, _ := strconv.Atoi(portOf(b.ln.Addr()))
			p := newTestProxier(t, Options{IPv4Portals: okSyncer{}, DataPath: path})
			p.OnServiceAdd(makeService("loop", withExternalIPPort("127.0.0.53", int32(port))))
			p.OnEndpointSliceAdd(makeSlice("loop", v1.ProtocolTCP, net.JoinHostPort("127.0.0.53", strconv.Itoa(port))))
			p.Sync()
			if name, err := askName(t, "127.0.0.1", proxyAddr(t, p, "default/loop:p")); err == nil {
				t.Fatalf("the client was served by %q, the Service's own portal address: want it refused, the endpoint not dialled", name)
			}
		})
	}
	t.Run("UDP", func(t *testing.T) {
		echo := startUDPEcho(t, "127.0.0.53:0", "")
		port := echo.LocalAddr().(*net.UDPAddr).Port
		p := newTestProxier(t, Options{IPv4Portals: okSyncer{}})
		p.OnServiceAdd(makeService("loop", withProtocol(v1.ProtocolUDP), withExternalIPPort("127.0.0.53", int32(port))))
		p.OnEndpointSliceAdd(makeSlice("loop", v1.ProtocolUDP, net.JoinHostPort("127.0.0.53", strconv.Itoa(port))))
		p.Sync()
		if answer, err := askUDP(t, proxyAddr(t, p, "default/loop:p"), "q", 2*time.Second); err == nil {
			t.Fatalf("the client got the answer %q from the Service's own portal address: want its datagram dropped, the endpoint not dialled", answer)
		}
	})
}

// TestOwnPortalBesideEndpoints: an endpoint at one of the proxy's own
// portals is passed over, not dialled, and the Service's other endpoints
// serve every client, those whose round-robin turn or affinity falls on it
// too (each such client was refused).
func TestOwnPortalBesideEndpoints(t *testing.T) {
	for _, path := range []string{DataPathGoroutines, DataPathEventLoop} {
		for _, affinity := range []int32{0, 600} {
			t.Run("TCP "+path+" affinity "+strconv.Itoa(int(affinity)), func(t *testing.T) {
				bs := startBackends(t, "127.0.0.53", "127.0.0.54")
				port, _ := strconv.Atoi(portOf(bs[0].ln.Addr()))
				p := newTestProxier(t, Options{IPv4Portals: okSyncer{}, DataPath: path})
				opts := []svcOpt{withExternalIPPort("127.0.0.53", int32(port))}
				if affinity > 0 {
					opts = append(opts, withClientIPAffinity(affinity))
				}
				p.OnServiceAdd(makeService("loop", opts...))
				p.OnEndpointSliceAdd(makeSlice("loop", v1.ProtocolTCP,
					net.JoinHostPort("127.0.0.53", strconv.Itoa(port)), net.JoinHostPort("127.0.0.54", strconv.Itoa(port))))
				p.Sync()
				for i := range 4 {
					if name, err := askName(t, "127.0.0.1", proxyAddr(t, p, "default/loop:p")); err != nil || name != "backend-b" {
						t.Fatalf("client %d: served by %q (%v); want backend-b, the endpoint that is no portal", i, name, err)
					}
				}
			})
		}
	}
	t.Run("UDP", func(t *testing.T) {
		own := startUDPEcho(t, "127.0.0.53:0", "own:")
		port := own.LocalAddr().(*net.UDPAddr).Port
		startUDPEcho(t, net.JoinHostPort("127.0.0.54", strconv.Itoa(port)), "real:")
		p := newTestProxier(t, Options{IPv4Portals: okSyncer{}})
		p.OnServiceAdd(makeService("loop", withProtocol(v1.ProtocolUDP), withExternalIPPort("127.0.0.53", int32(port))))
		p.OnEndpointSliceAdd(makeSlice("loop", v1.ProtocolUDP,
			net.JoinHostPort("127.0.0.53", strconv.Itoa(port)), net.JoinHostPort("127.0.0.54", strconv.Itoa(port))))
		p.Sync()
		for i := range 4 {
			if answer, err := askUDP(t, proxyAddr(t, p, "default/loop:p"), "q", 5*time.Second); err != nil || answer != "real:q" {
				t.Fatalf("client %d: answer %q (%v); want \"real:q\", from the endpoint that is no portal", i, answer, err)
			}
		}
	})
}

// TestManyOwnPortalsBesideAnEndpoint: endpoints at the proxy's own
// portals take no dial attempt, however many: 4 of them beside one live
// endpoint (more than the 4 attempts) still serve every client there. UDP
// spent an attempt on each and re-picked past the last one only, so a
// client whose turn fell on the first of the 4 was dropped.
func TestManyOwnPortalsBesideAnEndpoint(t *testing.T) {
	own := []string{"127.0.0.53", "127.0.0.54", "127.0.0.55", "127.0.0.56"}
	for _, proto := range []v1.Protocol{v1.ProtocolUDP, v1.ProtocolTCP} {
		for _, affinity := range []int32{0, 600} {
			t.Run(string(proto)+" affinity "+strconv.Itoa(int(affinity)), func(t *testing.T) {
				var port int
				var ask func() (string, error)
				p := newTestProxier(t, Options{IPv4Portals: okSyncer{}})
				if proto == v1.ProtocolUDP {
					port = startUDPEcho(t, "127.0.0.57:0", "real:").LocalAddr().(*net.UDPAddr).Port
					ask = func() (string, error) { return askUDP(t, proxyAddr(t, p, "default/loop:p"), "q", 5*time.Second) }
				} else {
					port, _ = strconv.Atoi(portOf(startBackends(t, "127.0.0.57")[0].ln.Addr()))
					ask = func() (string, error) { return askName(t, "127.0.0.1", proxyAddr(t, p, "default/loop:p")) }
				}
				endpoints := []string{net.JoinHostPort("127.0.0.57", strconv.Itoa(port))}
				for _, ip := range own {
					endpoints = append(endpoints, net.JoinHostPort(ip, strconv.Itoa(port)))
				}
				opts := []svcOpt{withProtocol(proto), withExternalIPPort(own[0], int32(port)), func(s *v1.Service) { s.Spec.ExternalIPs = own }}
				if affinity > 0 {
					opts = append(opts, withClientIPAffinity(affinity))
				}
				p.OnServiceAdd(makeService("loop", opts...))
				p.OnEndpointSliceAdd(makeSlice("loop", proto, endpoints...))
				p.Sync()
				want := "real:q"
				if proto == v1.ProtocolTCP {
					want = "backend-a"
				}
				for i := range 2 * len(endpoints) {
					if answer, err := ask(); err != nil || answer != want {
						t.Fatalf("client %d: answer %q (%v); want %q, from the one endpoint that is no portal", i, answer, err, want)
					}
				}
			})
		}
	}
}

// The set holds IP portals exactly, NodePorts at the node's own addresses
// only (a pod may listen on a NodePort's number), and nothing of the other
// protocol.
func TestOwnPortalsCaptures(t *testing.T) {
	var o ownPortals
	ap := netip.MustParseAddrPort
	if o.captures(iptables.TCP, ap("10.96.0.10:80")) {
		t.Fatal("captured before any sync")
	}
	sync := func(v4, v6 []iptables.Portal) {
		o.written(0, v4, false)
		o.written(1, v6, false)
	}
	sync([]iptables.Portal{
		{Protocol: iptables.TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40000},
		{Protocol: iptables.UDP, NodePort: true, Port: 30053, ProxyPort: 40001},
		{Protocol: iptables.TCP, GuardOnly: true, ProxyPort: 40002},
	}, []iptables.Portal{{Protocol: iptables.TCP, IP: netip.MustParseAddr("fd00::10"), Port: 443, ProxyPort: 40003}})
	for _, c := range []struct {
		proto iptables.Protocol
		ep    string
		want  bool
	}{
		{iptables.TCP, "10.96.0.10:80", true},
		{iptables.TCP, "[::ffff:10.96.0.10]:80", true},
		{iptables.UDP, "10.96.0.10:80", false},
		{iptables.TCP, "10.96.0.10:81", false},
		{iptables.TCP, "[fd00::10]:443", true},
		{iptables.UDP, "127.0.0.1:30053", true},
		{iptables.UDP, "127.0.0.2:30053", true},   // loopback: local, though on no interface
		{iptables.UDP, "192.0.2.77:30053", false}, // not this node's
		{iptables.TCP, "127.0.0.1:30053", false},
		{iptables.TCP, "0.0.0.0:40002", false},
	} {
		if got := o.captures(c.proto, ap(c.ep)); got != c.want {
			t.Errorf("%s %s: captured %v, want %v", c.proto, c.ep, got, c.want)
		}
	}
	// The same portals again keep the set; a portal gone leaves it.
	before4, before6 := o.families[0].set.Load(), o.families[1].set.Load()
	sync([]iptables.Portal{
		{Protocol: iptables.TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40000},
		{Protocol: iptables.UDP, NodePort: true, Port: 30053, ProxyPort: 40001},
		{Protocol: iptables.TCP, GuardOnly: true, ProxyPort: 40002},
	}, []iptables.Portal{{Protocol: iptables.TCP, IP: netip.MustParseAddr("fd00::10"), Port: 443, ProxyPort: 40003}})
	if o.families[0].set.Load() != before4 || o.families[1].set.Load() != before6 {
		t.Error("the same portals built the set again")
	}
	sync([]iptables.Portal{
		{Protocol: iptables.TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40000},
		{Protocol: iptables.UDP, NodePort: true, Port: 30053, ProxyPort: 40001},
	}, nil)
	if o.captures(iptables.TCP, ap("[fd00::10]:443")) || !o.captures(iptables.TCP, ap("10.96.0.10:80")) {
		t.Error("after the last portal went: the set did not follow")
	}
	sync([]iptables.Portal{{Protocol: iptables.UDP, NodePort: true, Port: 30053, ProxyPort: 40001}}, nil)
	if o.captures(iptables.TCP, ap("10.96.0.10:80")) || !o.captures(iptables.UDP, ap("127.0.0.1:30053")) {
		t.Error("after the ClusterIP portal went: the set did not follow")
	}
}

// An endpoint on a NodePort's number at an address not the node's (a pod
// of a Service whose targetPort is its nodePort) is looked up in the
// node's addresses as listed at most localAddrsFor ago: each of its
// connections listed the interfaces (24 µs, 44 allocations here).
func TestOwnPortalsListNodeAddressesRarely(t *testing.T) {
	var o ownPortals
	o.written(0, []iptables.Portal{{Protocol: iptables.TCP, NodePort: true, Port: 30080, ProxyPort: 40000}}, false)
	pod := netip.MustParseAddrPort("10.244.1.5:30080")
	if o.captures(iptables.TCP, pod) {
		t.Fatal("a pod's endpoint on a NodePort's number captured")
	}
	if allocs := testing.AllocsPerRun(100, func() { o.captures(iptables.TCP, pod) }); allocs != 0 {
		t.Errorf("a pod's endpoint on a NodePort's number: %v allocations per dial, want none (the node's addresses listed once)", allocs)
	}
	// A listing serves its time, then the addresses are listed again.
	at := netip.MustParseAddrPort("192.0.2.77:30080")
	o.local.Store(&localAddrs{at: mono.Now(), addrs: []netip.Addr{at.Addr()}})
	if !o.captures(iptables.TCP, at) {
		t.Error("an address of the last listing is not the node's")
	}
	o.local.Store(&localAddrs{at: mono.Now() - int64(localAddrsFor), addrs: []netip.Addr{at.Addr()}})
	if o.captures(iptables.TCP, at) {
		t.Error("a listing older than localAddrsFor was not made again")
	}
}

// A failed write keeps the set, built again only when the sync asked for
// a portal it lacks: a rules write failing at every retry (a held xtables
// lock) did not rebuild 10,000 Services' set each time.
func TestOwnPortalsFailedWritesKeepTheSet(t *testing.T) {
	var o ownPortals
	a := iptables.Portal{Protocol: iptables.TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40000}
	b := iptables.Portal{Protocol: iptables.TCP, IP: netip.MustParseAddr("10.96.0.11"), Port: 80, ProxyPort: 40001}
	o.written(0, []iptables.Portal{a, b}, false)
	before := o.families[0].set.Load()
	o.written(0, []iptables.Portal{b}, true)
	o.written(0, []iptables.Portal{b, a}, true)
	if o.families[0].set.Load() != before {
		t.Error("failed writes of portals the set holds built it again")
	}
	c := iptables.Portal{Protocol: iptables.TCP, IP: netip.MustParseAddr("10.96.0.12"), Port: 80, ProxyPort: 40002}
	o.written(0, []iptables.Portal{c}, true)
	for _, ep := range []string{"10.96.0.10:80", "10.96.0.11:80", "10.96.0.12:80"} {
		if !o.captures(iptables.TCP, netip.MustParseAddrPort(ep)) {
			t.Errorf("after failed writes: %s not captured, which the kernel may hold", ep)
		}
	}
	o.written(0, []iptables.Portal{c}, false)
	if o.captures(iptables.TCP, netip.MustParseAddrPort("10.96.0.10:80")) || !o.captures(iptables.TCP, netip.MustParseAddrPort("10.96.0.12:80")) {
		t.Error("after a good write: the set does not hold exactly what it wrote")
	}
}
