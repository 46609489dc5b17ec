package proxier

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// A NodePort is held open while its Service exists, so no other process can
// bind it and silently lose its traffic to our portal rules: not on every
// address (the wildcard), nor on any one of them. A held UDP port once
// connected to a loopback peer (to make datagrams outside
// --nodeport-addresses get a port unreachable), which made the kernel
// narrow its bound address to the route's source, 127.0.0.1: every other
// address was free to take.
func TestNodePortIsClaimed(t *testing.T) {
	for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
		t.Run(string(proto), func(t *testing.T) {
			network := map[v1.Protocol]string{v1.ProtocolTCP: "tcp", v1.ProtocolUDP: "udp"}[proto]
			port := freePortFor(t, network)
			p := newTestProxier(t, Options{ClaimNodePorts: true})
			svc := makeService("web", withProtocol(proto), withNodePort(int32(port)))
			p.OnServiceAdd(svc)
			p.Sync()
			for _, host := range []string{"", "127.0.0.1", "127.0.0.2"} {
				if err := bindableOn(network, host, port); err == nil {
					t.Errorf("%s NodePort %d could be bound on %q by another process", network, port, host)
				}
			}
			p.OnServiceDelete(svc)
			p.Sync()
			if err := bindable(network, port); err != nil {
				t.Fatalf("NodePort %d still held after the Service was deleted: %v", port, err)
			}
		})
	}
}

// withExternalIPPort gives the Service one external IP and its port.
func withExternalIPPort(ip string, port int32) svcOpt {
	return func(s *v1.Service) {
		s.Spec.ExternalIPs = []string{ip}
		s.Spec.Ports[0].Port = port
	}
}

func freePortFor(t *testing.T, network string) int {
	t.Helper()
	if network == "tcp" {
		ln, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}
	pc, err := net.ListenPacket("udp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

func bindable(network string, port int) error { return bindableOn(network, "", port) }

func bindableOn(network, host string, port int) error {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	if strings.HasPrefix(network, "tcp") {
		ln, err := net.Listen(network, addr)
		if err == nil {
			ln.Close()
		}
		return err
	}
	pc, err := net.ListenPacket(network, addr)
	if err == nil {
		pc.Close()
	}
	return err
}

// A claimed TCP port is bound, not listening: a connection the portals do
// not catch (here none are installed, as for a NodePort on an address
// outside --nodeport-addresses) is refused at once. A listening claim
// completed the handshake and the client hung on a backlog nobody read.
// The port stays held against listeners on one address and SO_REUSEADDR.
func TestClaimedTCPPortRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		svc  func(port int) svcOpt
	}{
		{"NodePort", func(port int) svcOpt { return withNodePort(int32(port)) }},
		{"local external IP", func(port int) svcOpt { return withExternalIPPort("127.0.0.1", int32(port)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			port := freePortFor(t, "tcp")
			p := newTestProxier(t, Options{ClaimNodePorts: true})
			p.OnServiceAdd(makeService("web", tt.svc(port)))
			p.Sync()
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			wantRefused(t, addr, "a claimed port")
			if ln, err := net.Listen("tcp", addr); err == nil {
				ln.Close()
				t.Fatalf("another process could listen on %s (SO_REUSEADDR) while it is claimed", addr)
			}
		})
	}
}

// A NodePort claim that fails names its address as every address ("*"), not
// netip's "invalid IP" / "invalid AddrPort" of the zero address.
func TestClaimErrorNamesEveryAddress(t *testing.T) {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	_, err = holdTCPPort(netip.Addr{}, port)
	if err == nil {
		t.Fatal("claimed a port another socket listens on")
	}
	if want := "bind *:" + strconv.Itoa(port) + ": "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q, want it to begin %q", err, want)
	}
	if got := claimAddress(netip.MustParseAddr("192.0.2.1")); got != "192.0.2.1" {
		t.Errorf("claimAddress(192.0.2.1) = %q", got)
	}
}

// A NodePort is held in the families it is served in: an IPv6-only
// Service's port stays free in IPv4 (whose clients then get the kernel's
// refusal, where a held UDP port swallowed their datagrams), an IPv4-only
// one's in IPv6.
func TestNodePortClaimedInItsFamilies(t *testing.T) {
	for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
		for _, tt := range []struct {
			name       string
			clusterIPs []string
			held, free string // networks
		}{
			{"IPv6-only", []string{"fd00::10"}, "6", "4"},
			{"IPv4-only", []string{"10.96.0.10"}, "4", "6"},
		} {
			t.Run(string(proto)+" "+tt.name, func(t *testing.T) {
				network := map[v1.Protocol]string{v1.ProtocolTCP: "tcp", v1.ProtocolUDP: "udp"}[proto]
				port := freePortFor(t, network)
				p := newTestProxier(t, Options{ClaimNodePorts: true, BindAddress: netip.MustParseAddr("::")})
				p.OnServiceAdd(makeService("web", withProtocol(proto), withNodePort(int32(port)), func(s *v1.Service) {
					s.Spec.ClusterIP, s.Spec.ClusterIPs = tt.clusterIPs[0], tt.clusterIPs
				}))
				p.Sync()
				if err := bindable(network+tt.held, port); err == nil {
					t.Fatalf("%s%s NodePort %d could be bound by another process", network, tt.held, port)
				}
				if err := bindable(network+tt.free, port); err != nil {
					t.Fatalf("%s%s NodePort %d is held, though the Service has no such family: %v", network, tt.free, port, err)
				}
			})
		}
	}
}

// Held ports that move between service ports in one sync stay held: two
// ports of a Service swapping their NodePorts, or a Service taking the
// NodePort another gives up. The sync released and took each port's
// claims in turn, in the map's random order, so the port met first could
// not bind what the other still held: it logged "another process holds
// it" and the port stayed free until that Service port changed again
// (5-6 of 6 swaps left one free, in the API-server sweep).
func TestClaimsMoveBetweenServicePorts(t *testing.T) {
	a, b := freePortFor(t, "tcp"), freePortFor(t, "tcp")
	twoPorts := func(first, second int) svcOpt {
		return func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports = []v1.ServicePort{
				{Name: "a", Port: 80, Protocol: v1.ProtocolTCP, NodePort: int32(first)},
				{Name: "b", Port: 81, Protocol: v1.ProtocolTCP, NodePort: int32(second)},
			}
		}
	}
	held := func(t *testing.T, ports ...int) {
		t.Helper()
		for _, port := range ports {
			if err := bindable("tcp", port); err == nil {
				t.Fatalf("NodePort %d is not held", port)
			}
		}
	}
	t.Run("swap", func(t *testing.T) {
		p := newTestProxier(t, Options{ClaimNodePorts: true})
		p.OnServiceAdd(makeService("np", twoPorts(a, b)))
		p.Sync()
		held(t, a, b)
		for i := range 8 { // the map's order is random: several swaps
			if i%2 == 0 {
				p.OnServiceUpdate(makeService("np", twoPorts(a, b)), makeService("np", twoPorts(b, a)))
			} else {
				p.OnServiceUpdate(makeService("np", twoPorts(b, a)), makeService("np", twoPorts(a, b)))
			}
			p.Sync()
			held(t, a, b)
		}
	})
	t.Run("to another Service", func(t *testing.T) {
		for range 8 {
			p := newTestProxier(t, Options{ClaimNodePorts: true})
			giver := makeService("giver", withNodePort(int32(a)))
			p.OnServiceAdd(giver)
			p.Sync()
			held(t, a)
			p.OnServiceUpdate(giver, makeService("giver", withNodePort(int32(b))))
			p.OnServiceAdd(makeService("taker", withClusterIP("10.96.0.11"), withNodePort(int32(a))))
			p.Sync()
			held(t, a, b)
			stopNow(p) // closes its sockets for the next round
		}
	})
}

// A port another process holds is taken once it lets go (a proxy being
// replaced in an overlapping rolling update): the sync's retry and every
// later sync try again. It was tried only when the Service port changed.
func TestClaimRetriedUntilHeld(t *testing.T) {
	port := freePortFor(t, "tcp")
	other, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	p := newTestProxier(t, Options{ClaimNodePorts: true})
	p.OnServiceAdd(makeService("np", withNodePort(int32(port))))
	p.Sync()
	if !slices.Contains(p.lastFailed, "claim default/np:p") || p.runner.retry == 0 {
		t.Errorf("no retry asked for the claim another process holds (left undone: %q)", p.lastFailed)
	}
	other.Close()
	p.Sync() // the retry
	if err := bindable("tcp", port); err == nil {
		t.Fatalf("NodePort %d is not held once the other process let it go", port)
	}
}

// A --proxy-port-range over a Service's NodePort gives that port to no
// proxy socket, so the NodePort hold is never the proxy's own socket: a
// service port took it (4 of 5 ports handed out at random), and the hold
// logged "another process holds it" and was retried forever.
func TestProxyPortRangeSkipsNodePorts(t *testing.T) {
	for round := range 10 { // the allocator picks at random
		svcs := []*v1.Service{makeService("np", withClusterIP("10.96.0.1"), withNodePort(30080))}
		for i := range 3 {
			svcs = append(svcs, makeService(fmt.Sprintf("s%d", i), withClusterIP(fmt.Sprintf("10.96.1.%d", i+1))))
		}
		p := syncedProxier(Options{PortRange: PortRange{Base: 30078, Size: 5}}, true, svcs...)
		if len(p.active) != 4 {
			t.Fatalf("round %d: %d service ports served, want 4 (left undone: %q)", round, len(p.active), p.lastFailed)
		}
		for name, ap := range p.active {
			if ap.proxyPort == 30080 {
				t.Fatalf("round %d: %s took NodePort 30080 for its proxy socket", round, name)
			}
		}
	}
}

// A NodePort that appears on a port one of our proxy sockets listens on
// (a Service created or changed while the proxy runs) is held all the
// same: the proxy socket moves to another port of the range in that sync,
// its rules with it, as kube-proxy's holds come first. The socket stayed,
// and the hold failed ("another process holds it") on every sync.
func TestProxySocketMovesOffANewNodePort(t *testing.T) {
	base := freeTCPPorts(t, 3)
	p := newTestProxier(t, Options{ClaimNodePorts: true, PortRange: PortRange{Base: base, Size: 3}})
	p.OnServiceAdd(makeService("a", withClusterIP("10.96.0.10")))
	p.Sync()
	taken, ok := p.ProxyPort("default/a:p")
	if !ok {
		t.Fatalf("a has no proxy socket (left undone: %q)", p.lastFailed)
	}
	p.OnServiceAdd(makeService("b", withClusterIP("10.96.0.11"), withNodePort(int32(taken))))
	p.Sync()
	moved, ok := p.ProxyPort("default/a:p")
	switch {
	case !ok:
		t.Fatalf("a lost its proxy socket (left undone: %q)", p.lastFailed)
	case moved == taken:
		t.Fatalf("a still listens on %d, now b's NodePort (left undone: %q)", taken, p.lastFailed)
	case len(p.lastFailed) > 0:
		t.Fatalf("the sync left %q undone", p.lastFailed)
	}
	if port, ok := p.ProxyPort("default/b:p"); !ok || port == taken {
		t.Fatalf("b's proxy socket: port %d, served %v; want one other than its NodePort %d", port, ok, taken)
	}
	if err := bindable("tcp", taken); err == nil {
		t.Fatalf("b's NodePort %d is not held", taken)
	}
	if err := bindableOn("tcp", "127.0.0.1", moved); err == nil {
		t.Fatalf("no socket of a's listens on its new proxy port %d", moved)
	}
}

// A socket on a port that becomes a node port moves only onto a port the
// range has free, after the sync's new service ports have theirs: with a
// --proxy-port-range of two ports, a ClusterIP Service serving on the
// one a new NodePort Service names keeps its socket there (the hold fails,
// naming the proxy's own socket), and the new Service takes the other.
// Closed before a port was known to be free, the socket was lost and
// either Service left unserved ("proxy port range exhausted") for good.
func TestProxySocketStaysOnANodePortWhenTheRangeIsFull(t *testing.T) {
	for round := range 5 { // the sync meets the two in map order
		base := freeTCPPorts(t, 2)
		p := newTestProxier(t, Options{ClaimNodePorts: true, PortRange: PortRange{Base: base, Size: 2}})
		p.OnServiceAdd(makeService("a", withClusterIP("10.96.0.10")))
		p.Sync()
		taken, ok := p.ProxyPort("default/a:p")
		if !ok {
			t.Fatalf("round %d: a has no proxy socket (left undone: %q)", round, p.lastFailed)
		}
		p.OnServiceAdd(makeService("b", withClusterIP("10.96.0.11"), withNodePort(int32(taken))))
		p.Sync()
		if port, ok := p.ProxyPort("default/a:p"); !ok || port != taken {
			t.Fatalf("round %d: a, serving on %d, now on %d (served %v); left undone %q", round, taken, port, ok, p.lastFailed)
		}
		if port, ok := p.ProxyPort("default/b:p"); !ok || port == taken {
			t.Fatalf("round %d: b's proxy socket: port %d, served %v (left undone %q)", round, port, ok, p.lastFailed)
		}
	}
}

// freeTCPPorts finds n consecutive ports no one listens on and returns
// the first.
func freeTCPPorts(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		base := freePortFor(t, "tcp")
		if base+n-1 > 65535 {
			continue
		}
		free := true
		for port := base; port < base+n && free; port++ {
			free = bindable("tcp", port) == nil
		}
		if free {
			return base
		}
	}
	t.Skipf("found no %d consecutive free ports", n)
	return 0
}

// Either socket of an externalTrafficPolicy: Local port moves off a port
// that becomes a node port (a NodePort or a healthCheckNodePort, which the
// health server listens on), its portals with it; the other socket keeps
// its port.
func TestExternalSocketMovesOffANewNodePort(t *testing.T) {
	cfg := iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.168.1.10")}
	for _, tc := range []struct {
		name  string
		other func(port int32) *v1.Service
	}{
		{"NodePort", func(port int32) *v1.Service {
			return makeService("other", withClusterIP("10.96.0.11"), withNodePort(port))
		}},
		{"healthCheckNodePort", func(port int32) *v1.Service {
			svc := localLB("other", port)
			svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"}
			svc.Spec.Ports[0].NodePort = 30081
			return svc
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := iptables.NewFakeRunner(iptables.IPv4)
			p := syncedProxier(Options{IPv4Portals: iptables.New(fake, cfg), PortRange: PortRange{Base: 40000, Size: 5}, NodeName: "n1"},
				true, localLB("local", 0))
			local := p.active[loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "local"}, Port: "p", Protocol: v1.ProtocolTCP}]
			if local == nil || local.external == nil {
				t.Fatalf("local has no external socket (left undone: %q)", p.lastFailed)
			}
			cluster, external := local.proxyPort, local.externalPort
			p.OnServiceAdd(tc.other(int32(external)))
			p.Sync()
			switch {
			case len(p.lastFailed) > 0:
				t.Fatalf("the sync left %q undone", p.lastFailed)
			case local.socket == nil || p.active[local.info.name] == local:
				t.Fatal("local's sockets were not reopened")
			}
			now := p.active[local.info.name]
			if now.proxyPort != cluster || now.externalPort == external || now.externalPort == 0 {
				t.Errorf("local's ports: cluster %d, external %d; want cluster %d kept and external off %d",
					now.proxyPort, now.externalPort, cluster, external)
			}
			for name, ap := range p.active {
				if ap.proxyPort == external || ap.externalPort == external {
					t.Errorf("%s listens on node port %d", name, external)
				}
			}
			nat, err := fake.Save(iptables.TableNAT)
			if err != nil {
				t.Fatal(err)
			}
			target := "192.168.1.10:" + strconv.Itoa(external)
			for _, rule := range strings.Split(string(nat), "\n") {
				if strings.HasSuffix(rule, " "+target) {
					t.Errorf("a portal still sends traffic to %s: %s", target, rule)
				}
			}
		})
	}
}
