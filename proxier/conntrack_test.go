package proxier

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

type fakeConntrack struct {
	mu      sync.Mutex
	cleared []string
	spared  map[string][]int // UDP target → the live proxy ports its clearing spared
	// sparedTCP: TCP target → the live proxy ports whose reset
	// connections its clearing spared.
	sparedTCP map[string][]int
	passes    int // ClearStale calls: each is a walk of the table
}

func (f *fakeConntrack) ClearStale(flows []StaleFlows) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.passes++
	for _, fl := range flows {
		target := fmt.Sprintf("%v:%d", fl.Dst.Addr(), fl.Dst.Port())
		if fl.Protocol == v1.ProtocolTCP {
			f.cleared = append(f.cleared, "tcp "+target)
			if f.sparedTCP == nil {
				f.sparedTCP = map[string][]int{}
			}
			f.sparedTCP[target] = fl.Live
			continue
		}
		f.cleared = append(f.cleared, "udp "+target)
		if f.spared == nil {
			f.spared = map[string][]int{}
		}
		f.spared[target] = fl.Live
	}
	return nil
}

// newConntrackProxier is newPortalProxier clearing entries in a fake.
func newConntrackProxier(t *testing.T) (*Proxier, *fakeConntrack) {
	t.Helper()
	ct := &fakeConntrack{}
	p, _ := newPortalProxier(t)
	p.opts.Conntrack = ct
	return p, ct
}

// udpDNSWithExternalSocket is UDP service port dns, which must have an
// external socket (externalTrafficPolicy: Local).
func udpDNSWithExternalSocket(t *testing.T, p *Proxier) *activePort {
	t.Helper()
	dns := servicePortName("dns")
	dns.Protocol = v1.ProtocolUDP
	ap := p.active[dns]
	if ap == nil || ap.external == nil {
		t.Fatal("no external socket for the Local policy")
	}
	return ap
}

// take returns what was cleared since the last call, sorted.
func (f *fakeConntrack) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.cleared
	f.cleared = nil
	slices.Sort(out)
	return out
}

func TestNewSocketClearsStaleConntrack(t *testing.T) {
	p, ct := newConntrackProxier(t)
	svc := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053))
	p.OnServiceAdd(svc)
	p.OnServiceAdd(makeService("web", withClusterIP("10.96.0.20"), withNodePort(30080)))
	p.Sync()
	// UDP: every entry to the service IPs and the NodePort; TCP: the
	// un-NATed entries of the service IPs, and the reset ones of both.
	want := []string{"tcp 10.96.0.20:80", "tcp invalid IP:30080", "udp 10.96.0.10:80", "udp invalid IP:30053"}
	if got := ct.take(); !slices.Equal(got, want) {
		t.Fatalf("cleared %v, want %v", got, want)
	}
	if ct.passes != 1 {
		t.Errorf("%d passes over the conntrack table for one sync, want 1", ct.passes)
	}
	// Flows the portal already sent to the new socket are not stale.
	dns := servicePortName("dns")
	dns.Protocol = v1.ProtocolUDP
	live := []int{p.active[dns].proxyPort}
	for target, spared := range ct.spared {
		if !slices.Equal(spared, live) {
			t.Errorf("clearing %s spared ports %v, want the proxy port %v", target, spared, live)
		}
	}
	// TCP: a connection reset to a port no socket of ours holds (the last
	// proxy's, which reset its connections at its exit) is stale too;
	// those to the new socket's port are not. Before, TCP named no live
	// port: entries NATed anywhere were kept.
	web := servicePortName("web")
	if got, want := ct.sparedTCP["10.96.0.20:80"], []int{p.active[web].proxyPort}; !slices.Equal(got, want) {
		t.Errorf("clearing the TCP ClusterIP spared ports %v, want the proxy port %v", got, want)
	}
	// A sync that keeps the sockets clears nothing.
	p.OnServiceUpdate(svc, svc)
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("unchanged sockets cleared conntrack again: %v", got)
	}
}

// The ports to clear are kept until a portal sync succeeds: clearing before
// the rules are in would let new flows be tracked un-NATed again, and
// forgetting them would leave the stale entries.
func TestConntrackClearingWaitsForSuccessfulSync(t *testing.T) {
	ct := &fakeConntrack{}
	p, fake := newPortalProxier(t)
	p.opts.Conntrack = ct
	fake.Errors = map[string]error{"Restore": errors.New("injected restore failure")}
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a failed sync cleared %v", got)
	}
	p.OnServiceAdd(makeService("web", withClusterIP("10.96.0.20")))
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a failed sync cleared %v", got)
	}
	fake.Errors = nil
	p.Sync()
	want := []string{"tcp 10.96.0.20:80", "udp 10.96.0.10:80"}
	if got := ct.take(); !slices.Equal(got, want) {
		t.Fatalf("after the first successful sync cleared %v, want %v", got, want)
	}
	if rules := fake.Rules(iptables.TableNAT, iptables.ChainPortalsContainer); len(rules) != 2 {
		t.Fatalf("portals not written: %q", rules)
	}
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a second successful sync cleared %v again", got)
	}
}

func TestStaleSetMatches(t *testing.T) {
	const proxyPort = 40000
	flow := func(proto uint8, dst string, replySrc string) *netlink.ConntrackFlow {
		d, r := netip.MustParseAddrPort(dst), netip.MustParseAddrPort(replySrc)
		f := &netlink.ConntrackFlow{}
		f.Forward.Protocol, f.Forward.DstIP, f.Forward.DstPort = proto, d.Addr().AsSlice(), d.Port()
		f.Reverse.Protocol, f.Reverse.SrcIP, f.Reverse.SrcPort = proto, r.Addr().AsSlice(), r.Port()
		return f
	}
	// tcp is a TCP flow in the kernel's state (nl.TCP_CONNTRACK_*).
	tcp := func(dst, replySrc string, state uint8) *netlink.ConntrackFlow {
		f := flow(unix.IPPROTO_TCP, dst, replySrc)
		f.ProtoInfo = &netlink.ProtoInfoTCP{State: state}
		return f
	}
	service := netip.MustParseAddrPort("10.96.0.10:53")
	nodePort := netip.AddrPortFrom(netip.Addr{}, 30053)
	for _, tc := range []struct {
		name   string
		target netip.AddrPort
		flow   *netlink.ConntrackFlow
		stale  bool
	}{
		{"tracked before the portal existed", service, flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.96.0.10:53"), true},
		{"redirected to the live socket", service, flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.0.0.1:40000"), false},
		{"DNATed to the live socket from the node", service, flow(unix.IPPROTO_UDP, "10.96.0.10:53", "127.0.0.1:40000"), false},
		{"redirected to a socket that is gone", service, flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.0.0.1:41000"), true},
		{"another service IP", service, flow(unix.IPPROTO_UDP, "10.96.0.11:53", "10.96.0.11:53"), false},
		{"another port", service, flow(unix.IPPROTO_UDP, "10.96.0.10:54", "10.96.0.10:54"), false},
		{"TCP to a UDP destination", service, flow(unix.IPPROTO_TCP, "10.96.0.10:53", "10.96.0.10:53"), false},
		{"TCP tracked before the portal existed", service, flow(unix.IPPROTO_TCP, "10.96.0.20:80", "10.96.0.20:80"), true},
		{"TCP through a portal, to whatever port", service, flow(unix.IPPROTO_TCP, "10.96.0.20:80", "10.0.0.1:41000"), false},
		{"TCP established to a port not ours (a proxy beside this one)", service, tcp("10.96.0.20:80", "10.0.0.1:41000", nl.TCP_CONNTRACK_ESTABLISHED), false},
		{"TCP half-closed to a port not ours", service, tcp("10.96.0.20:80", "10.0.0.1:41000", nl.TCP_CONNTRACK_FIN_WAIT), false},
		{"TCP reset, to a port gone (the last proxy's)", service, tcp("10.96.0.20:80", "10.0.0.1:41000", nl.TCP_CONNTRACK_CLOSE), true},
		{"TCP reset, to the live socket", service, tcp("10.96.0.20:80", "10.0.0.1:40000", nl.TCP_CONNTRACK_CLOSE), false},
		{"TCP reset, un-NATed", service, tcp("10.96.0.20:80", "10.96.0.20:80", nl.TCP_CONNTRACK_CLOSE), true},
		{"IPv6, un-NATed", netip.MustParseAddrPort("[fd00::10]:53"), flow(unix.IPPROTO_UDP, "[fd00::10]:53", "[fd00::10]:53"), true},
		{"IPv6, live", netip.MustParseAddrPort("[fd00::10]:53"), flow(unix.IPPROTO_UDP, "[fd00::10]:53", "[fd00::1]:40000"), false},
		{"NodePort on any address, un-NATed", nodePort, flow(unix.IPPROTO_UDP, "192.168.1.5:30053", "192.168.1.5:30053"), true},
		{"NodePort on any address, live", nodePort, flow(unix.IPPROTO_UDP, "192.168.1.5:30053", "192.168.1.5:40000"), false},
		// A NodePort on one family's addresses (the other's rules not
		// written yet): each family's pass is of its own addresses.
		{"NodePort on IPv4 addresses, un-NATed", netip.MustParseAddrPort("0.0.0.0:30053"), flow(unix.IPPROTO_UDP, "192.168.1.5:30053", "192.168.1.5:30053"), true},
		{"NodePort on IPv6 addresses, live", netip.MustParseAddrPort("[::]:30053"), flow(unix.IPPROTO_UDP, "[fd00::5]:30053", "[fd00::5]:40000"), false},
		{"NodePort on IPv6 addresses, un-NATed", netip.MustParseAddrPort("[::]:30053"), flow(unix.IPPROTO_UDP, "[fd00::5]:30053", "[fd00::5]:30053"), true},
		{"un-NATed where the service port is the proxy port", netip.MustParseAddrPort("10.96.0.10:40000"),
			flow(unix.IPPROTO_UDP, "10.96.0.10:40000", "10.96.0.10:40000"), true},
		// A TCP NodePort (ResetOnly): the reset connections NATed to a
		// port gone (the overlapped proxy's) only. Before, none: a
		// client reusing such a source port was refused.
		{"TCP NodePort reset, to a port gone", service, tcp("192.168.1.5:30080", "192.168.1.5:41000", nl.TCP_CONNTRACK_CLOSE), true},
		{"TCP NodePort reset, to the live socket", service, tcp("192.168.1.5:30080", "192.168.1.5:40000", nl.TCP_CONNTRACK_CLOSE), false},
		{"TCP NodePort established, to a port gone", service, tcp("192.168.1.5:30080", "192.168.1.5:41000", nl.TCP_CONNTRACK_ESTABLISHED), false},
		{"TCP NodePort, un-NATed (the node's connection to that port elsewhere)", service, tcp("198.51.100.7:30080", "198.51.100.7:30080", nl.TCP_CONNTRACK_SYN_SENT), false},
		{"TCP NodePort reset, un-NATed", service, tcp("198.51.100.7:30080", "198.51.100.7:30080", nl.TCP_CONNTRACK_CLOSE), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var set staleSet
			set.add(StaleFlows{Protocol: v1.ProtocolUDP, Dst: tc.target, Live: []int{proxyPort}})
			set.add(StaleFlows{Protocol: v1.ProtocolTCP, Dst: netip.MustParseAddrPort("10.96.0.20:80"), Live: []int{proxyPort}})
			set.add(StaleFlows{Protocol: v1.ProtocolTCP, Dst: netip.AddrPortFrom(netip.Addr{}, 30080), Live: []int{proxyPort}, ResetOnly: true})
			if got := set.MatchConntrackFlow(tc.flow); got != tc.stale {
				t.Errorf("stale = %v, want %v", got, tc.stale)
			}
		})
	}
}

// When a UDP Service's externalTrafficPolicy goes from Local back to
// Cluster, its external socket closes and NodePort clients must leave the
// entries that NAT them to that socket's port: a client that keeps its
// source port (a resolver, a syslog sender) would refresh the entry and
// send to a closed port for as long as it keeps sending.
func TestClosedExternalSocketClearsItsFlows(t *testing.T) {
	p, ct := newConntrackProxier(t)
	local := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053))
	local.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	p.OnServiceAdd(local)
	p.Sync()
	ap := udpDNSWithExternalSocket(t, p)
	ct.take()
	p.OnServiceUpdate(local, makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053)))
	p.Sync()
	if ap.external != nil {
		t.Fatal("the external socket outlived the Local policy")
	}
	if got := ct.take(); !slices.Contains(got, "udp invalid IP:30053") {
		t.Fatalf("closing the external socket cleared %v, want the NodePort's entries", got)
	}
	if spared := ct.spared["invalid IP:30053"]; !slices.Equal(spared, []int{ap.proxyPort}) {
		t.Errorf("the NodePort's clearing spared %v, want only the cluster socket's port %d", spared, ap.proxyPort)
	}
}

// And the other way: Cluster to Local opens the external socket, and the
// NodePort's entries NATed to the cluster-wide socket are stale (only the
// external socket's port is spared): a client that keeps its source port
// stayed on cluster-wide endpoints for as long as it sent, so the Local
// policy never applied to it (a review's finding).
func TestOpenedExternalSocketClearsClusterFlows(t *testing.T) {
	p, ct := newConntrackProxier(t)
	cluster := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053))
	p.OnServiceAdd(cluster)
	p.Sync()
	ct.take()
	local := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053))
	local.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	p.OnServiceUpdate(cluster, local)
	p.Sync()
	ap := udpDNSWithExternalSocket(t, p)
	if got := ct.take(); !slices.Contains(got, "udp invalid IP:30053") {
		t.Fatalf("opening the external socket cleared %v, want the NodePort's entries", got)
	}
	if spared := ct.spared["invalid IP:30053"]; !slices.Equal(spared, []int{ap.externalPort}) {
		t.Errorf("the NodePort's clearing spared %v, want only the external socket's port %d", spared, ap.externalPort)
	}
	if spared := ct.spared["10.96.0.10:80"]; slices.Contains(spared, ap.externalPort) {
		t.Errorf("the ClusterIP's clearing spared %v, the external socket's port among them (no ClusterIP flow goes there)", spared)
	}
}

// A traffic-policy change spares, at the NodePort, only the sockets every
// client the old rules sent there still meets. An internalTrafficPolicy
// flip under externalTrafficPolicy Local swaps the two sockets' endpoint
// sets without reopening them: external clients move from the external
// socket to the cluster IP's and the node and pods the other way, so
// nothing is spared (a pod keeping its source port stayed on the socket the
// shortcut used before, now node-local: refused on a node without a local
// endpoint). Back from both Local to internalTrafficPolicy Local alone, the
// node and pods stay on the external socket, which is spared; a socket no
// client was sent to before is spared too (nothing of the old rules there).
func TestPolicyChangeClearsFlowsOfMovedClients(t *testing.T) {
	local := v1.ServiceInternalTrafficPolicyLocal
	policy := func(itp, etp bool) *v1.Service {
		return makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053), func(s *v1.Service) {
			if itp {
				s.Spec.InternalTrafficPolicy = &local
			}
			if etp {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}
		})
	}
	p, ct := newConntrackProxier(t)
	old := policy(false, true)
	p.OnServiceAdd(old)
	p.Sync()
	ap := udpDNSWithExternalSocket(t, p)
	cluster, external := ap.proxyPort, ap.externalPort
	for _, step := range []struct {
		name     string
		itp, etp bool
		spared   []int
	}{
		{"ETP Local to both Local", true, true, nil},
		{"both Local to ETP Local", false, true, nil},
		{"ETP Local to both Local again", true, true, nil},
		{"both Local to ITP Local", true, false, []int{external}},
		// No entry of the NodePort was NATed to the cluster IP's socket.
		{"ITP Local to both Local", true, true, []int{cluster}},
		{"both Local to both Cluster", false, false, []int{cluster}},
	} {
		ct.take()
		svc := policy(step.itp, step.etp)
		p.OnServiceUpdate(old, svc)
		old = svc
		p.Sync()
		if got := ct.take(); !slices.Contains(got, "udp invalid IP:30053") {
			t.Fatalf("%s: cleared %v, want the NodePort's entries", step.name, got)
		}
		if spared := ct.spared["invalid IP:30053"]; !slices.Equal(spared, step.spared) {
			t.Errorf("%s: the NodePort's clearing spared %v, want %v (cluster IP's socket %d, external %d)",
				step.name, spared, step.spared, cluster, external)
		}
		if spared := ct.spared["10.96.0.10:80"]; !slices.Equal(spared, []int{cluster}) {
			t.Errorf("%s: the ClusterIP's clearing spared %v, want its socket %d", step.name, spared, cluster)
		}
	}
	if len(p.policyMoved) != 0 {
		t.Errorf("moves kept after their clearing: %v", p.policyMoved)
	}
}

// A service port whose rules change (a NodePort added, here) has its
// stale entries cleared too: a client that sent to the NodePort before
// its portal existed holds an un-NATed entry, refreshed by each datagram.
func TestChangedRulesClearStaleFlows(t *testing.T) {
	p, ct := newConntrackProxier(t)
	clusterIP := makeService("dns", withProtocol(v1.ProtocolUDP))
	p.OnServiceAdd(clusterIP)
	p.Sync()
	ct.take()
	p.OnServiceUpdate(clusterIP, makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053)))
	p.Sync()
	want := []string{"udp 10.96.0.10:80", "udp invalid IP:30053"}
	if got := ct.take(); !slices.Equal(got, want) {
		t.Fatalf("adding a NodePort cleared %v, want %v", got, want)
	}
}

// TestExternalSocketOpenedOnRetryClearsFlows: while a Local Service's external
// socket cannot open, its NodePort has no portal, and datagrams sent meanwhile
// leave un-NATed entries; when a retry opens the socket (the Service object
// unchanged, so its rules compare equal) those entries must be cleared too,
// or such a client keeps missing the new portal for as long as it sends.
func TestExternalSocketOpenedOnRetryClearsFlows(t *testing.T) {
	p, ct := newConntrackProxier(t)
	calls := 0
	p.listen = func(_ loadbalancer.ServicePortName, _ netip.Addr, _ int, _ bool, _ *loadbalancer.ServicePort, _ *faults.Port, _ *socketConfig) (proxySocket, error) {
		calls++
		if calls == 2 { // the first external socket
			return nil, errors.New("port held")
		}
		return planSocket(41000 + calls), nil
	}
	svc := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053))
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	p.OnServiceAdd(svc)
	p.Sync()
	ct.take()
	p.Sync() // the retry opens the external socket
	if got := ct.take(); !slices.ContainsFunc(got, func(s string) bool { return strings.HasSuffix(s, ":30053") }) {
		t.Errorf("external socket opened on a retry; flows to its NodePort not cleared (cleared %v)", got)
	}
}

// TestClosedUDPPortClearsItsFlows: a UDP service port whose socket closes
// for good (its Service deleted, the port removed, its protocol changed)
// leaves entries NATed to its dead proxy port, which a client that reuses
// its source port refreshes for as long as it sends. They are cleared
// after the first successful sync that removed its rules, every one of
// them but those NATed to a socket now serving the destination; TCP
// entries are connections and are left alone.
func TestClosedUDPPortClearsItsFlows(t *testing.T) {
	udp := func(name string, opts ...svcOpt) *v1.Service {
		return makeService(name, append([]svcOpt{withProtocol(v1.ProtocolUDP)}, opts...)...)
	}
	withExternalIP := func(ip string) svcOpt {
		return func(s *v1.Service) { s.Spec.ExternalIPs = []string{ip} }
	}
	unnamed := func(s *v1.Service) { s.Spec.Ports[0].Name = "" }
	twoPorts := func(s *v1.Service) {
		s.Spec.Ports = []v1.ServicePort{{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}, {Name: "web", Port: 80, Protocol: v1.ProtocolTCP}}
	}
	webOnly := func(s *v1.Service) { s.Spec.Ports = s.Spec.Ports[1:] }
	for _, tc := range []struct {
		name   string
		before *v1.Service
		change func(p *Proxier, before *v1.Service)
		want   []string
		// sparedBy: the service port whose proxy port the clearing of
		// 10.96.0.10:80 must spare (zero: nothing is spared anywhere).
		sparedBy loadbalancer.ServicePortName
	}{{
		name:   "UDP Service deleted",
		before: udp("dns", withNodePort(30053), withExternalIP("192.0.2.10")),
		change: func(p *Proxier, before *v1.Service) { p.OnServiceDelete(before) },
		want:   []string{"udp 10.96.0.10:80", "udp 192.0.2.10:80", "udp invalid IP:30053"},
	}, {
		name:   "UDP port removed from its Service",
		before: makeService("dns", twoPorts),
		change: func(p *Proxier, before *v1.Service) { p.OnServiceUpdate(before, makeService("dns", twoPorts, webOnly)) },
		want:   []string{"udp 10.96.0.10:53"},
	}, {
		name:   "unnamed port's protocol changed to TCP",
		before: udp("dns", unnamed),
		change: func(p *Proxier, before *v1.Service) { p.OnServiceUpdate(before, makeService("dns", unnamed)) },
		// The new TCP socket's un-NATed entries, as for any new socket.
		want: []string{"tcp 10.96.0.10:80", "udp 10.96.0.10:80"},
	}, {
		name:   "ClusterIP served by a new Service in the same sync",
		before: udp("dns"),
		change: func(p *Proxier, before *v1.Service) {
			p.OnServiceDelete(before)
			p.OnServiceAdd(udp("dns2"))
		},
		// Once for the new socket, once for the closed one.
		want:     []string{"udp 10.96.0.10:80", "udp 10.96.0.10:80"},
		sparedBy: loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "dns2"}, Port: "p", Protocol: v1.ProtocolUDP},
	}, {
		name:   "TCP Service deleted",
		before: makeService("web", withNodePort(30080)),
		change: func(p *Proxier, before *v1.Service) { p.OnServiceDelete(before) },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ct := &fakeConntrack{}
			p, fake := newPortalProxier(t)
			p.opts.Conntrack = ct
			p.OnServiceAdd(tc.before)
			p.Sync()
			ct.take()
			clear(ct.spared)

			// The rules are removed only by a successful sync: clearing
			// before it lets the old portal NAT the next datagram again.
			fake.Errors = map[string]error{"Restore": errors.New("injected restore failure")}
			tc.change(p, tc.before)
			p.Sync()
			if got := ct.take(); len(got) != 0 {
				t.Fatalf("a failed sync cleared %v", got)
			}
			fake.Errors = nil
			p.Sync()
			if got := ct.take(); !slices.Equal(got, tc.want) {
				t.Fatalf("cleared %v, want %v", got, tc.want)
			}
			for target, spared := range ct.spared {
				var want []int
				if ap := p.active[tc.sparedBy]; ap != nil && target == "10.96.0.10:80" {
					want = []int{ap.proxyPort}
				}
				if !slices.Equal(spared, want) {
					t.Errorf("clearing %s spared ports %v, want %v", target, spared, want)
				}
			}
			p.Sync()
			if got := ct.take(); len(got) != 0 {
				t.Errorf("the next sync cleared %v again", got)
			}
		})
	}
}

// TestLostUDPDestinationClearsItsFlows: a UDP service port that stays open
// but loses a destination (an external IP, LB ingress IP or NodePort
// removed from its Service, its ClusterIP changed, its IPv6 ClusterIP
// dropped, which reopens its socket) leaves entries NATed to its proxy
// port through the removed portal, which a client that reuses its source
// port refreshes for as long as it sends. They are cleared after the first
// successful sync that removed the portal, sparing only the proxy ports of
// another socket that serves the destination now; the destinations the
// port keeps spare its own proxy port, as for any change of its rules.
func TestLostUDPDestinationClearsItsFlows(t *testing.T) {
	udp := func(name string, opts ...svcOpt) *v1.Service {
		return makeService(name, append([]svcOpt{withProtocol(v1.ProtocolUDP)}, opts...)...)
	}
	withExternalIP := func(ip string) svcOpt {
		return func(s *v1.Service) { s.Spec.ExternalIPs = []string{ip} }
	}
	withLBIP := func(ip string) svcOpt {
		return func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30053
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ip}}
		}
	}
	dualStack := func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }
	other := loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "other"}, Port: "p", Protocol: v1.ProtocolUDP}
	for _, tc := range []struct {
		name          string
		before, after *v1.Service
		// also: another Service, present throughout.
		also *v1.Service
		want []string
		// lost: the destinations the port lost; their clearing spares
		// other's proxy ports if sparedByOther, else none.
		lost          []string
		sparedByOther bool
	}{{
		name:   "external IP removed",
		before: udp("dns", withExternalIP("192.0.2.10")),
		after:  udp("dns"),
		want:   []string{"udp 10.96.0.10:80", "udp 192.0.2.10:80"},
		lost:   []string{"192.0.2.10:80"},
	}, {
		name:   "LoadBalancer ingress IP removed",
		before: udp("dns", withLBIP("198.51.100.1")),
		after:  udp("dns", withLBIP("198.51.100.2")),
		want:   []string{"udp 10.96.0.10:80", "udp 198.51.100.1:80", "udp 198.51.100.2:80", "udp invalid IP:30053"},
		lost:   []string{"198.51.100.1:80"},
	}, {
		name:   "NodePort removed",
		before: udp("dns", withNodePort(30053)),
		after:  udp("dns"),
		want:   []string{"udp 10.96.0.10:80", "udp invalid IP:30053"},
		lost:   []string{"invalid IP:30053"},
	}, {
		name:   "NodePort changed",
		before: udp("dns", withNodePort(30053)),
		after:  udp("dns", withNodePort(30054)),
		want:   []string{"udp 10.96.0.10:80", "udp invalid IP:30053", "udp invalid IP:30054"},
		lost:   []string{"invalid IP:30053"},
	}, {
		name:   "ClusterIP changed",
		before: udp("dns"),
		after:  udp("dns", withClusterIP("10.96.0.11")),
		want:   []string{"udp 10.96.0.10:80", "udp 10.96.0.11:80"},
		lost:   []string{"10.96.0.10:80"},
	}, {
		name:   "IPv6 ClusterIP dropped (the socket reopens)",
		before: udp("dns", dualStack),
		after:  udp("dns"),
		want:   []string{"udp 10.96.0.10:80", "udp fd00::10:80"},
		lost:   []string{"fd00::10:80"},
	}, {
		name:          "external IP removed that another Service still serves",
		before:        udp("dns", withExternalIP("192.0.2.10")),
		after:         udp("dns"),
		also:          udp("other", withClusterIP("10.96.0.20"), withExternalIP("192.0.2.10")),
		want:          []string{"udp 10.96.0.10:80", "udp 192.0.2.10:80"},
		lost:          []string{"192.0.2.10:80"},
		sparedByOther: true,
	}, {
		name:   "external IP added: nothing lost",
		before: udp("dns"),
		after:  udp("dns", withExternalIP("192.0.2.10")),
		want:   []string{"udp 10.96.0.10:80", "udp 192.0.2.10:80"},
	}, {
		name:   "TCP external IP removed: connections, left alone",
		before: makeService("web", withExternalIP("192.0.2.10")),
		after:  makeService("web"),
		want:   []string{"tcp 10.96.0.10:80"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ct := &fakeConntrack{}
			p, _ := newPortalProxier(t)
			p.opts.Conntrack = ct
			// Both families, so that dropping the IPv6 ClusterIP is a rule
			// change a failed restore holds back; each write fails while
			// failing is set, also one with nothing to change (a family
			// whose rules are in is cleared at once: TestStaleFlowsClearedPerFamily).
			var failing atomic.Bool
			p.opts.IPv4Portals = failingRules{p.opts.IPv4Portals.(*iptables.Rules), &failing}
			fake6 := iptables.NewFakeRunner(iptables.IPv6)
			p.opts.IPv6Portals = failingRules{iptables.New(fake6, iptables.Config{Family: iptables.IPv6, BindAddress: mustAddr("::1"), NodeIP: mustAddr("::1")}), &failing}
			p.OnServiceAdd(tc.before)
			if tc.also != nil {
				p.OnServiceAdd(tc.also)
			}
			p.Sync()
			ct.take()
			clear(ct.spared)

			failing.Store(true)
			p.OnServiceUpdate(tc.before, tc.after)
			p.Sync()
			if got := ct.take(); len(got) != 0 {
				t.Fatalf("a failed sync cleared %v", got)
			}
			failing.Store(false)
			p.Sync()
			if got := ct.take(); !slices.Equal(got, tc.want) {
				t.Fatalf("cleared %v, want %v", got, tc.want)
			}
			name := loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: tc.after.Name}, Port: "p", Protocol: tc.after.Spec.Ports[0].Protocol}
			own := p.active[name]
			if own == nil {
				t.Fatalf("%s is not served after the change", name)
			}
			for target, spared := range ct.spared {
				var want []int
				switch {
				case !slices.Contains(tc.lost, target):
					want = []int{own.proxyPort}
				case tc.sparedByOther:
					want = []int{p.active[other].proxyPort}
				}
				if !slices.Equal(spared, want) {
					t.Errorf("clearing %s spared ports %v, want %v", target, spared, want)
				}
			}
			p.Sync()
			if got := ct.take(); len(got) != 0 {
				t.Errorf("the next sync cleared %v again", got)
			}
		})
	}
}

// A repair of rules another process rewrote (a second proxy's sync named
// its own ports, then it exited) clears the UDP entries its portals NATed
// to its ports: a client that keeps its source port (a resolver, statsd)
// refreshed its entry with every datagram and stayed on the dead port for
// as long as it sent. A full sync that finds nothing changed clears
// nothing. Before, the repair cleared nothing (the test failed at the
// repair).
func TestRepairedRulesClearFlowsToOtherPorts(t *testing.T) {
	p, fake := newPortalProxier(t)
	ct := &fakeConntrack{}
	p.opts.Conntrack = ct
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.Sync()
	ct.take()
	p.SyncFull()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a full sync of unchanged rules cleared %v", got)
	}
	// The other proxy's rules: the same portals, to its own port.
	otherProxy := func() {
		t.Helper()
		for _, chain := range []string{iptables.ChainPortalsContainer, iptables.ChainPortalsHost} {
			for _, r := range fake.Rules(iptables.TableNAT, chain) {
				other := regexp.MustCompile(`--to-ports? [0-9]+|--to-destination ([0-9.]+):[0-9]+`).ReplaceAllStringFunc(r, func(s string) string {
					return s[:strings.LastIndexAny(s, " :")+1] + "41999"
				})
				if other == r {
					continue // another Service's, rewritten already
				}
				if err := fake.Restore([]byte("*nat\n-D " + chain + " " + r + "\n-A " + chain + " " + other + "\nCOMMIT\n")); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	otherProxy()
	p.RepairSoon()
	p.Sync()
	if got, want := ct.take(), []string{"udp 10.96.0.10:80"}; !slices.Equal(got, want) {
		t.Fatalf("the repair cleared %v, want %v", got, want)
	}
	dns := servicePortName("dns")
	dns.Protocol = v1.ProtocolUDP
	if got, want := ct.spared["10.96.0.10:80"], []int{p.active[dns].proxyPort}; !slices.Equal(got, want) {
		t.Errorf("the repair's clearing spared %v, want the live proxy port %v", got, want)
	}
	// A repair in the full sync that also writes a change of ours.
	otherProxy()
	p.OnServiceAdd(makeService("web", withClusterIP("10.96.0.20")))
	p.SyncFull()
	if got, want := ct.take(), []string{"tcp 10.96.0.20:80", "udp 10.96.0.10:80"}; !slices.Equal(got, want) {
		t.Fatalf("the repair with a change of ours cleared %v, want %v", got, want)
	}
}

// A rolling restart overlaps two proxies: the new one's first sync moves
// every service port to its own proxy ports while the old one runs, and
// the old one resets its connections when it stops, leaving conntrack
// entries in CLOSE NATed to its dead ports, through which a client's next
// connection from the same source port was sent there and refused (for as
// long as it retried: each refusal refreshes the entry). The sync asked
// for when the other proxy is gone (RepairSoon) finds the rules its own,
// rewrites nothing, and cleared nothing: it clears the TCP entries to the
// service IPs now, as a repair that rewrote rules does. Before, it
// cleared nothing (the test failed at the first check).
func TestOtherProxyGoneClearsFlowsItReset(t *testing.T) {
	p, _ := newPortalProxier(t)
	ct := &fakeConntrack{}
	p.opts.Conntrack = ct
	p.OnServiceAdd(makeService("web"))
	p.Sync()
	ct.take()
	p.RepairSoon() // the overlapped proxy exited; our rules are unchanged
	p.Sync()
	if got, want := ct.take(), []string{"tcp 10.96.0.10:80"}; !slices.Equal(got, want) {
		t.Fatalf("the sync after the other proxy's exit cleared %v, want %v", got, want)
	}
	if got, want := ct.sparedTCP["10.96.0.10:80"], []int{p.active[servicePortName("web")].proxyPort}; !slices.Equal(got, want) {
		t.Errorf("the clearing spared %v, want the live proxy port %v", got, want)
	}
	// A periodic full sync of unchanged rules still clears nothing.
	p.SyncFull()
	if got := ct.take(); len(got) != 0 {
		t.Errorf("a periodic full sync cleared %v", got)
	}
}

// A traffic-policy change that comes with a reopen of the socket (on its
// ports: an unnamed port's number changed, so its fault name; or an IPv6
// address added) clears as one without: the reopen forgot the old policy
// before the change was recorded, so ETP Local to both Local spared the
// cluster IP's socket at the NodePort, where pods' entries NATed to it
// while it had every endpoint kept them on it, node-local now (refused
// without a local endpoint) for as long as they kept their source port.
func TestPolicyChangeWithAReopenClearsFlowsOfMovedClients(t *testing.T) {
	local := v1.ServiceInternalTrafficPolicyLocal
	p, ct := newConntrackProxier(t)
	dns := func(port int32, itp bool) *v1.Service {
		return makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053), func(s *v1.Service) {
			s.Spec.Ports[0].Name, s.Spec.Ports[0].Port = "", port
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			if itp {
				s.Spec.InternalTrafficPolicy = &local
			}
		})
	}
	old := dns(53, false)
	p.OnServiceAdd(old)
	p.Sync()
	spn := p.lbName("default/dns")
	before := p.active[spn]
	if before == nil || before.external == nil {
		t.Fatal("no external socket for the Local policy")
	}
	cluster, external := before.proxyPort, before.externalPort
	ct.take()
	svc := dns(54, true)
	p.OnServiceUpdate(old, svc)
	p.Sync()
	ap := p.active[spn]
	if ap == nil || ap == before || ap.proxyPort != cluster || ap.externalPort != external {
		t.Fatalf("want the port reopened on its ports %d, %d", cluster, external)
	}
	if got := ct.take(); !slices.Contains(got, "udp invalid IP:30053") {
		t.Fatalf("cleared %v, want the NodePort's entries", got)
	}
	if spared := ct.spared["invalid IP:30053"]; len(spared) != 0 {
		t.Errorf("ETP Local to both Local with a reopen: the NodePort's clearing spared %v, want none: every client moved (cluster IP's socket %d, external %d)",
			spared, cluster, external)
	}
	if len(p.policyMoved) != 0 {
		t.Errorf("moves kept after their clearing: %v", p.policyMoved)
	}
}

// A UDP port whose Local policy's second socket cannot open has no portal
// at its external addresses meanwhile (appendPortals), so the clearing
// spares no socket there: the cluster IP's was spared, as if the external
// addresses still sent clients to it, and an external client keeping its
// source port, NATed to it under externalTrafficPolicy Cluster, kept
// reaching every node's endpoints through its entry after the change to
// Local, which the missing portal was meant to prevent.
func TestPolicyChangeToAnUnopenedSecondSocketSparesNothing(t *testing.T) {
	p, ct := newConntrackProxier(t)
	dns := func(etpLocal bool) *v1.Service {
		return makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053), func(s *v1.Service) {
			if etpLocal {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}
		})
	}
	old := dns(false)
	p.OnServiceAdd(old)
	p.Sync()
	dnsName := servicePortName("dns")
	dnsName.Protocol = v1.ProtocolUDP
	ap := p.active[dnsName]
	if ap == nil {
		t.Fatal("no dns socket")
	}
	cluster := ap.proxyPort
	p.listen = func(_ loadbalancer.ServicePortName, _ netip.Addr, port int, _ bool, _ *loadbalancer.ServicePort, _ *faults.Port, _ *socketConfig) (proxySocket, error) {
		return nil, fmt.Errorf("listen on port %d: address already in use", port)
	}
	ct.take()
	p.OnServiceUpdate(old, dns(true))
	p.Sync()
	if ap := p.active[dnsName]; ap == nil || ap.external != nil || ap.proxyPort != cluster {
		t.Fatalf("want the cluster IP's socket on %d and no second one", cluster)
	}
	if got := ct.take(); !slices.Contains(got, "udp invalid IP:30053") {
		t.Fatalf("cleared %v, want the NodePort's entries", got)
	}
	if spared := ct.spared["invalid IP:30053"]; len(spared) != 0 {
		t.Errorf("the NodePort (no portal while the second socket is missing): clearing spared %v, want none", spared)
	}
	if spared := ct.spared["10.96.0.10:80"]; !slices.Equal(spared, []int{cluster}) {
		t.Errorf("the ClusterIP's clearing spared %v, want its socket %d", spared, cluster)
	}
}
