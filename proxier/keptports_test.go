package proxier

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// Reserve takes only ports the allocator would hand out and no one of ours
// holds; OpenPreferred listens there, or, when another process holds the
// port, releases it and opens another.
func TestPortAllocatorReserve(t *testing.T) {
	inUse := fmt.Errorf("listen: %w", syscall.EADDRINUSE)
	// Candidates 65532-65535 above a fake ephemeral range 1024-65531.
	pool := func() *PortAllocator {
		return NewNodePortAllocator(kernelPorts{Ephemeral: PortRange{Base: 1024, Size: 65532 - 1024}})
	}
	for _, tc := range []struct {
		name     string
		alloc    *PortAllocator
		ours     []int // already handed out
		ports    []int
		reserved []int
	}{
		{"free candidates", pool(), nil, []int{65532, 65534}, []int{65532, 65534}},
		{"not candidates: the ephemeral range, 0, beyond 65535", pool(), nil, []int{40000, 0, -1, 70000}, nil},
		{"already ours", pool(), []int{65534}, []int{65534, 65535}, []int{65535}},
		{"twice", pool(), nil, []int{65533, 65533}, []int{65533}},
		{"the explicit range", NewPortAllocator(PortRange{Base: 5000, Size: 10}), nil, []int{4999, 5003, 5010}, []int{5003}},
		{"kernel-chosen only", NewPortAllocator(PortRange{}), nil, []int{40000}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range tc.ours {
				if !tc.alloc.take(p) {
					t.Fatalf("cannot hand out %d", p)
				}
			}
			got := slices.Sorted(maps.Keys(tc.alloc.Reserve(tc.ports)))
			if !slices.Equal(got, tc.reserved) {
				t.Fatalf("reserved %v, want %v", got, tc.reserved)
			}
			for _, p := range got {
				if !tc.alloc.inUse[p] {
					t.Errorf("reserved port %d not marked as ours", p)
				}
			}
		})
	}

	t.Run("OpenPreferred", func(t *testing.T) {
		a := pool()
		a.Reserve([]int{65533, 65534})
		b := &fakeBinder{held: map[int]error{65534: inUse}}
		if sock, err := a.OpenPreferred(65533, b.listen); err != nil || sock.Port() != 65533 {
			t.Fatalf("OpenPreferred(65533): %v, %v", sock, err)
		}
		sock, err := a.OpenPreferred(65534, b.listen)
		if err != nil || sock.Port() == 65534 || sock.Port() == 65533 {
			t.Fatalf("OpenPreferred(65534) held by another process: %v, %v (tried %v)", sock, err, b.tried)
		}
		if a.inUse[65534] {
			t.Error("65534 still ours after its listen failed")
		}
		a.Release(65533)
		a.Release(sock.Port())
		if s := a.pool[0]; s.used != 0 {
			t.Errorf("segment counts %d ports in use after all were released", s.used)
		}
	})
}

// A proxy started over the rules of the one before it listens on the proxy
// ports those rules name: its first sync writes no portal, only the
// accepts of portal traffic its predecessor's stop flushed. A port someone
// else took meanwhile is replaced, and only its rules are rewritten.
func TestRestartKeepsProxyPorts(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	cfg := iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1")}
	services := []*v1.Service{
		makeService("a", withClusterIP("10.96.0.1")),
		makeService("b", withClusterIP("10.96.0.2"), withNodePort(30002)),
		makeService("dns", withClusterIP("10.96.0.3"), withProtocol(v1.ProtocolUDP)),
	}
	names := []string{"default/a:p", "default/b:p", "default/dns:p"}
	start := func() *Proxier {
		return syncedProxier(Options{BindAddress: mustAddr("127.0.0.1"), IPv4Portals: iptables.New(fake, cfg)}, false, services...)
	}
	ports := func(p *Proxier) []int {
		var out []int
		for _, n := range names {
			port, ok := p.ProxyPort(n)
			if !ok {
				t.Fatalf("no proxy socket for %s", n)
			}
			out = append(out, port)
		}
		return out
	}

	first := start()
	before := ports(first)
	stopNow(first)

	fake.ResetCalls()
	second := start()
	if got := ports(second); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("proxy ports after a restart %v, want the rules' %v", got, before)
	}
	// The accepts of portal traffic, which the stop flushed, come back;
	// no portal is written.
	if w := fake.Writes(); len(w) != 1 || strings.Contains(string(w[0]), "*nat") || !strings.Contains(string(w[0]), ":"+iptables.ChainPortalsNonLocal+" ") {
		t.Errorf("a restart over right rules wrote %d times, want once, the accepts only:\n%s", len(w), w)
	}
	stopNow(second)

	// Another process holds b's port now.
	other, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(before[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	fake.ResetCalls()
	logs := captureKlog(t)
	third := start()
	defer stopNow(third)
	got := ports(third)
	if got[0] != before[0] || got[2] != before[2] || got[1] == before[1] {
		t.Errorf("proxy ports %v with %d held by another process, want %d and %d kept and another for b", got, before[1], before[0], before[2])
	}
	if len(fake.Writes()) == 0 {
		t.Errorf("b's rules were not rewritten for its new port %d", got[1])
	}
	// The move is logged, naming both ports; the kept ones are not.
	klog.Flush()
	moved := fmt.Sprintf(`servicePort="default/b:p" protocol="TCP" keptPort=%d proxyPort=%d`, before[1], got[1])
	if out := logs.String(); !strings.Contains(out, moved) || strings.Count(out, "Proxy port taken by another process") != 1 {
		t.Errorf("want one line naming b's move (%s):\n%s", moved, out)
	}
	if rules := fake.Rules(iptables.TableNAT, iptables.ChainPortalsHost); !containsSubstring(rules, ":"+strconv.Itoa(got[1])) {
		t.Errorf("no host portal names b's new port %d: %q", got[1], rules)
	}
}

func containsSubstring(list []string, sub string) bool {
	return slices.ContainsFunc(list, func(s string) bool { return strings.Contains(s, sub) })
}

// A restart in a range with exactly one port left, one Service created
// while the proxy was down: every service port keeps its socket's port
// (the node-local socket of an externalTrafficPolicy: Local Service too),
// whatever order the sync opens them in, and the new Service gets the free
// one. Before the old rules' ports were reserved first, a port opened
// early in the sync could take one of them, and its Service's clients
// reached another Service until the rules were rewritten.
func TestRestartKeepsPortsOfAFullRange(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	cfg := iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.168.1.10"),
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	var services []*v1.Service
	for i := range 10 {
		services = append(services, makeService(fmt.Sprintf("s%d", i), withClusterIP(fmt.Sprintf("10.96.0.%d", i+1))))
	}
	local := localLB("local", 0)
	local.Spec.ClusterIP, local.Spec.ClusterIPs = "10.96.1.1", []string{"10.96.1.1"}
	local.Spec.ExternalIPs = []string{"203.0.113.9"}
	services = append(services, local)
	const ports = 13 // 10 + local's two sockets + the new Service
	start := func(fake *iptables.FakeRunner, svcs []*v1.Service) *Proxier {
		opts := Options{IPv4Portals: iptables.New(fake, cfg), PortRange: PortRange{Base: 47000, Size: ports}, NodeName: "n1"}
		return syncedProxier(opts, true, svcs...)
	}
	socketPorts := func(p *Proxier) map[string]int {
		out := map[string]int{}
		for name, ap := range p.active {
			out[name.String()] = ap.proxyPort
			if ap.external != nil {
				out[name.String()+" external"] = ap.externalPort
			}
		}
		return out
	}
	first := start(fake, services)
	before := socketPorts(first)
	var left [][]byte // the first proxier's rules
	for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
		dump, err := fake.Save(table)
		if err != nil {
			t.Fatal(err)
		}
		left = append(left, dump)
	}
	if len(before) != ports-1 {
		t.Fatalf("first proxier has %d sockets, want %d: %v", len(before), ports-1, before)
	}
	withNew := append(slices.Clone(services), makeService("new", withClusterIP("10.96.2.1")))
	for range 20 { // the sync's order is the map's
		over := iptables.NewFakeRunner(iptables.IPv4)
		for _, dump := range left {
			if err := over.Restore(dump); err != nil {
				t.Fatal(err)
			}
		}
		p := start(over, withNew)
		got := socketPorts(p)
		for name, port := range before {
			if got[name] != port {
				t.Fatalf("%s: port %d after the restart, want the rules' %d (all: %v)", name, got[name], port, got)
			}
		}
		if got["default/new:p"] == 0 {
			t.Fatalf("the new Service has no socket: %v", got)
		}
		for _, port := range before {
			if got["default/new:p"] == port {
				t.Fatalf("the new Service took %d, a port of the old rules", port)
			}
		}
	}
}

// Only ports a wanted service port can claim are reserved: with a full
// explicit range, a Service created while the proxy was down gets the port
// of one deleted meanwhile (a restart that reserved every port the old
// rules named left it without a socket until the periodic sync).
func TestRestartGivesDeletedServicesPortsToNewOnes(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	cfg := iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.168.1.10")}
	start := func(names ...string) *Proxier {
		var svcs []*v1.Service
		for i, n := range names {
			svcs = append(svcs, makeService(n, withClusterIP(fmt.Sprintf("10.96.0.%d", i+1))))
		}
		return syncedProxier(Options{IPv4Portals: iptables.New(fake, cfg), PortRange: PortRange{Base: 47000, Size: 3}}, true, svcs...)
	}
	first := start("s0", "s1", "s2")
	old := map[string]int{}
	for name, ap := range first.active {
		old[name.Name] = ap.proxyPort
	}
	second := start("s0", "s1", "new")
	got := map[string]int{}
	for name, ap := range second.active {
		got[name.Name] = ap.proxyPort
	}
	want := map[string]int{"s0": old["s0"], "s1": old["s1"], "new": old["s2"]}
	if !maps.Equal(got, want) {
		t.Errorf("ports after the restart %v, want %v", got, want)
	}
}

// syncedProxier is a proxier on opts that has synced svcs once; planned:
// its sockets are stand-ins that hold no port (planSocket).
func syncedProxier(opts Options, planned bool, svcs ...*v1.Service) *Proxier {
	p := New(opts)
	if planned {
		p.listen = func(_ loadbalancer.ServicePortName, _ netip.Addr, port int, _ bool, _ *loadbalancer.ServicePort, _ *faults.Port, _ *socketConfig) (proxySocket, error) {
			return planSocket(port), nil
		}
	}
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	for _, svc := range svcs {
		p.OnServiceAdd(svc)
	}
	p.Sync()
	return p
}

// A restart clears the UDP flows of destinations the old portals had and
// the new proxy does not serve (a Service deleted, a NodePort changed
// while no proxy ran), as a running proxy clears them when they go: a
// client that keeps its source port was still NATed to the old proxy port
// through its conntrack entry, and so served at an address the Service
// gave up, or answered by whichever Service the port was given to next.
func TestRestartClearsFlowsOfLostDestinations(t *testing.T) {
	udp := func(name, ip string, nodePort int32) *v1.Service {
		return makeService(name, withClusterIP(ip), withProtocol(v1.ProtocolUDP), withNodePort(nodePort))
	}
	for _, tc := range []struct {
		name        string
		before, now []*v1.Service
		want        []string // cleared
	}{
		{"service deleted, its port given to another",
			[]*v1.Service{udp("a", "10.96.0.1", 30090)}, []*v1.Service{udp("b", "10.96.0.2", 30091)},
			[]string{"udp 10.96.0.1:80", "udp invalid IP:30090"}},
		{"NodePort changed",
			[]*v1.Service{udp("a", "10.96.0.1", 30090)}, []*v1.Service{udp("a", "10.96.0.1", 30091)},
			[]string{"udp invalid IP:30090"}},
		{"nothing changed", []*v1.Service{udp("a", "10.96.0.1", 30090)}, []*v1.Service{udp("a", "10.96.0.1", 30090)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := iptables.NewFakeRunner(iptables.IPv4)
			cfg := iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.168.1.10")}
			opts := func(ct ConntrackCleaner) Options {
				return Options{IPv4Portals: iptables.New(fake, cfg), PortRange: PortRange{Base: 47000, Size: 1}, Conntrack: ct}
			}
			syncedProxier(opts(nil), true, tc.before...)
			ct := &fakeConntrack{}
			syncedProxier(opts(ct), true, tc.now...)
			// The new sockets' own destinations are cleared too, sparing
			// their proxy ports; a lost one is cleared of every entry.
			var lost []string
			for _, c := range ct.take() {
				if len(ct.spared[strings.TrimPrefix(c, "udp ")]) == 0 {
					lost = append(lost, c)
				}
			}
			if !slices.Equal(lost, tc.want) {
				t.Errorf("cleared whole %q, want %q", lost, tc.want)
			}
		})
	}
}

// Both traffic policies Local: a restart keeps both sockets' ports, the
// second (the node's and pods' shortcut to external addresses, named only
// by host rules and source-matched ones) too, for a NodePort-only Service
// as for one with an LB IP, and writes no portal. Before the host rule of
// a NodePort was not read, and the second port was looked for in the
// rules external clients meet, which name the cluster IP's socket there.
func TestRestartKeepsBothLocalProxyPorts(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	cfg := iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	local := v1.ServiceInternalTrafficPolicyLocal
	bothLocal := func(s *v1.Service) {
		s.Spec.InternalTrafficPolicy = &local
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
	lb := func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.20"}}
	}
	services := []*v1.Service{
		makeService("np", withClusterIP("10.96.0.1"), withNodePort(30001), bothLocal),
		makeService("lb", withClusterIP("10.96.0.2"), withNodePort(30002), lb, bothLocal),
	}
	start := func() *Proxier {
		return syncedProxier(Options{BindAddress: mustAddr("127.0.0.1"), IPv4Portals: iptables.New(fake, cfg), NodeName: "node1"}, false, services...)
	}
	ports := func(p *Proxier) [][2]int {
		var out [][2]int
		for _, n := range []string{"default/np:p", "default/lb:p"} {
			ap := p.active[p.lbName(n)]
			if ap == nil || ap.external == nil {
				t.Fatalf("%s: no second socket", n)
			}
			out = append(out, [2]int{ap.proxyPort, ap.externalPort})
		}
		return out
	}
	first := start()
	before := ports(first)
	stopNow(first)

	fake.ResetCalls()
	second := start()
	defer stopNow(second)
	if got := ports(second); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("proxy ports (cluster IP's, second) after a restart %v, want the rules' %v", got, before)
	}
	if w := fake.Writes(); len(w) != 1 || strings.Contains(string(w[0]), "*nat") {
		t.Errorf("a restart over right rules wrote %d times, want once, the accepts only:\n%s", len(w), w)
	}
}
