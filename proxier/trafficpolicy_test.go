package proxier

import (
	"k8s.io/klog/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// topologySlice has endpoints 10.1.0.1 on this node (zone a), 10.1.0.2 on
// node2 (zone a) and 10.1.0.3 on node3 (zone b), hinted for their zones.
func topologySlice(hints bool) *discovery.EndpointSlice {
	es := makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")
	nodes := []string{"node1", "node2", "node3"}
	zones := []string{"a", "a", "b"}
	for i := range es.Endpoints {
		es.Endpoints[i].NodeName = ptr.To(nodes[i])
		es.Endpoints[i].Zone = ptr.To(zones[i])
		if hints {
			es.Endpoints[i].Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: zones[i]}}}
		}
	}
	return es
}

func endpointsOf(t *testing.T, p *Proxier, spn loadbalancer.ServicePortName) []string {
	t.Helper()
	snap, _ := p.lb.Snapshot(spn)
	var out []string
	for _, e := range snap.Endpoints {
		out = append(out, e.Addr().String())
	}
	slices.Sort(out)
	return out
}

func TestTrafficPolicies(t *testing.T) {
	local := v1.ServiceInternalTrafficPolicyLocal
	tests := []struct {
		name         string
		svc          svcOpt
		hints        bool
		zone         string
		wantInternal []string
		wantExternal []string // nil: no separate external set
	}{
		{"cluster policies use every endpoint", withNodePort(30080), false, "", []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"}, nil},
		{"internalTrafficPolicy Local", func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local }, false, "",
			[]string{"10.1.0.1"}, nil},
		{"externalTrafficPolicy Local splits external traffic", func(s *v1.Service) {
			withNodePort(30080)(s)
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}, false, "", []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"}, []string{"10.1.0.1"}},
		{"internalTrafficPolicy Local splits external traffic", func(s *v1.Service) {
			withNodePort(30080)(s)
			s.Spec.InternalTrafficPolicy = &local
		}, false, "", []string{"10.1.0.1"}, []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"}},
		// kube-proxy's UsesClusterEndpoints: an externally accessible port
		// has the cluster-wide set whatever internalTrafficPolicy says (the
		// node's and pods' shortcut to its external addresses).
		{"both policies Local: the second socket has every endpoint", func(s *v1.Service) {
			withNodePort(30080)(s)
			s.Spec.InternalTrafficPolicy = &local
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}, false, "", []string{"10.1.0.1"}, []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"}},
		{"both policies Local, zone hints", func(s *v1.Service) {
			withNodePort(30080)(s)
			s.Spec.InternalTrafficPolicy = &local
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}, true, "a", []string{"10.1.0.1"}, []string{"10.1.0.1", "10.1.0.2"}},
		{"zone hints for this node's zone", withNodePort(30080), true, "a", []string{"10.1.0.1", "10.1.0.2"}, nil},
		{"zone hints ignored without a zone", withNodePort(30080), true, "", []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"}, nil},
		{"partial hints ignored", withNodePort(30080), false, "a", []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestProxier(t, Options{NodeName: "node1"})
			p.SetNodeZone(tt.zone)
			p.OnServiceAdd(makeService("web", tt.svc))
			p.OnEndpointSliceAdd(topologySlice(tt.hints))
			p.Sync()
			spn := loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "web"}, Port: "p", Protocol: v1.ProtocolTCP}
			strip := func(in []string) []string {
				for i := range in {
					in[i] = strings.TrimSuffix(in[i], ":8080")
				}
				return in
			}
			if got := strip(endpointsOf(t, p, spn)); !slices.Equal(got, tt.wantInternal) {
				t.Errorf("internal endpoints %v, want %v", got, tt.wantInternal)
			}
			ap := p.active[spn]
			if tt.wantExternal == nil {
				if ap.external != nil {
					t.Errorf("unexpected external socket")
				}
				return
			}
			if ap.external == nil {
				t.Fatalf("no external socket for a split policy")
			}
			if got := strip(endpointsOf(t, p, externalName(spn))); !slices.Equal(got, tt.wantExternal) {
				t.Errorf("external endpoints %v, want %v", got, tt.wantExternal)
			}
		})
	}
}

// NodePorts of an externalTrafficPolicy Local Service reach the external
// socket; the ClusterIP keeps the cluster-wide one.
func TestExternalLocalPortals(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), NodeIP: mustAddr("127.0.0.1")})
	p := newTestProxier(t, Options{IPv4Portals: rules, NodeName: "node1"})
	svc := makeService("web", withNodePort(30080))
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	p.OnServiceAdd(svc)
	p.Sync()
	ap := p.active[p.lbName("default/web:p")]
	nat := natRules(fake)
	if !strings.Contains(nat, "--dport 30080 -j DNAT --to-destination 127.0.0.1:"+strconv.Itoa(ap.externalPort)) {
		t.Fatalf("NodePort not sent to the external socket %d:\n%s", ap.externalPort, nat)
	}
	if !strings.Contains(nat, "10.96.0.10/32") || !strings.Contains(nat, "127.0.0.1:"+strconv.Itoa(ap.proxyPort)) {
		t.Fatalf("ClusterIP not sent to the cluster socket %d:\n%s", ap.proxyPort, nat)
	}
	// Back to Cluster: the external socket closes and NodePorts share the socket.
	p.OnServiceUpdate(svc, makeService("web", withNodePort(30080)))
	p.Sync()
	if ap.external != nil || ap.externalPort != 0 {
		t.Fatalf("external socket kept after policy went back to Cluster")
	}
}

// The network programming latency is observed from a slice's trigger time
// to the balancer having it, as kube-proxy: not for a trigger from before
// the proxy started (at a restart every existing slice was observed with
// its age), nor for a deleted slice (its trigger is its last change).
func TestNetworkProgrammingLatency(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(start)
	p := newTestProxier(t, Options{Clock: clk})
	p.OnServiceAdd(makeService("web"))
	p.Sync() // served: an endpoint change is programmed once the balancer has it
	stamped := func(name string, at time.Time) *discovery.EndpointSlice {
		es := makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080")
		es.Name = name
		es.Annotations = map[string]string{endpointsTriggerTimeAnnotation: at.Format(time.RFC3339Nano)}
		return es
	}
	old := stamped("web-old", start.Add(-time.Hour)) // from before the start
	p.OnEndpointSliceAdd(old)
	fresh := stamped("web-new", start.Add(time.Second))
	fresh.Endpoints[0].Addresses = []string{"10.1.0.2"}
	clk.Step(3 * time.Second)
	p.OnEndpointSliceAdd(fresh)
	p.OnEndpointSliceDelete(old)
	if n := testutil.CollectAndCount(p.metrics.NetworkProgrammingLatency); n != 2 {
		t.Fatalf("histogram series %d, want one per family", n)
	}
	m := &dtoHistogram{}
	m.read(t, p)
	if m.count != 1 || m.sum != 2 {
		t.Fatalf("programming latency count %d sum %.2fs, want one 2 s sample (the new slice's)", m.count, m.sum)
	}
}

// A slice change is programmed when its ports' proxy sockets and rules
// exist: for a new Service (or a new port of one already served) at the
// sync that opens them, not when the balancer has it (then nothing served
// it yet); ports this proxy opens no socket for (SCTP) wait for nothing,
// and a change to a port that is open is recorded at once.
func TestNetworkProgrammingLatencyWaitsForItsPorts(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	stamped := func(svc string, at time.Time, ports ...discovery.EndpointPort) *discovery.EndpointSlice {
		es := makeSlice(svc, v1.ProtocolTCP, "10.1.0.1:8080")
		es.Ports = append(es.Ports, ports...)
		es.Annotations = map[string]string{endpointsTriggerTimeAnnotation: at.Format(time.RFC3339Nano)}
		return es
	}
	port := func(name string, proto v1.Protocol) discovery.EndpointPort {
		return discovery.EndpointPort{Name: ptr.To(name), Port: ptr.To(int32(9000)), Protocol: ptr.To(proto)}
	}
	withPort := func(name string, proto v1.Protocol) svcOpt {
		return func(s *v1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: name, Port: 9000, Protocol: proto})
		}
	}
	samples := func(t *testing.T, p *Proxier) (uint64, float64) {
		m := &dtoHistogram{}
		m.read(t, p)
		return m.count, m.sum
	}
	t.Run("new Service", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(start)
		p := newTestProxier(t, Options{Clock: clk})
		clk.Step(2 * time.Second)
		p.OnEndpointSliceAdd(stamped("web", start.Add(time.Second))) // before its Service: nothing serves it
		p.OnServiceAdd(makeService("web"))
		if n, sum := samples(t, p); n != 0 {
			t.Fatalf("observed %d samples (sum %.2fs) before any sync served the Service", n, sum)
		}
		clk.Step(time.Second)
		p.Sync()
		if n, sum := samples(t, p); n != 1 || sum != 2 {
			t.Fatalf("count %d sum %.2fs, want one 2 s sample: trigger to the sync that served it", n, sum)
		}
	})
	t.Run("an SCTP port waits for nothing", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(start)
		p := newTestProxier(t, Options{Clock: clk})
		clk.Step(2 * time.Second)
		p.OnEndpointSliceAdd(stamped("web", start.Add(time.Second), port("sig", v1.ProtocolSCTP)))
		p.OnServiceAdd(makeService("web", withPort("sig", v1.ProtocolSCTP)))
		clk.Step(time.Second)
		p.Sync()
		if n, sum := samples(t, p); n != 1 || sum != 2 {
			t.Fatalf("count %d sum %.2fs, want one 2 s sample at the sync that opened the TCP port", n, sum)
		}
		moved := stamped("web", start.Add(2500*time.Millisecond), port("sig", v1.ProtocolSCTP))
		moved.Endpoints[0].Addresses = []string{"10.1.0.2"}
		p.OnEndpointSliceUpdate(nil, moved)
		if n, sum := samples(t, p); n != 2 || sum != 2.5 {
			t.Fatalf("count %d sum %.2fs, want a second sample of 0.5 s at once", n, sum)
		}
	})
	t.Run("a new port of a served Service", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(start)
		p := newTestProxier(t, Options{Clock: clk})
		p.OnServiceAdd(makeService("web"))
		p.Sync()
		p.OnServiceUpdate(makeService("web"), makeService("web", withPort("admin", v1.ProtocolTCP)))
		clk.Step(2 * time.Second)
		p.OnEndpointSliceAdd(stamped("web", start.Add(time.Second), port("admin", v1.ProtocolTCP)))
		if n, sum := samples(t, p); n != 0 {
			t.Fatalf("observed %d samples (sum %.2fs) before the sync opened the new port", n, sum)
		}
		clk.Step(time.Second)
		p.Sync()
		if n, sum := samples(t, p); n != 1 || sum != 2 {
			t.Fatalf("count %d sum %.2fs, want one 2 s sample at the sync that opened the port", n, sum)
		}
	})
	t.Run("a renamed port, then its slice", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(start)
		p := newTestProxier(t, Options{Clock: clk})
		p.OnServiceAdd(makeService("web"))
		p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080")) // port p
		p.Sync()
		renamed := makeService("web")
		renamed.Spec.Ports[0].Name = "q"
		p.OnServiceUpdate(makeService("web"), renamed)
		p.Sync()
		clk.Step(time.Second)
		es := stamped("web", start.Add(900*time.Millisecond))
		es.Ports[0].Name = ptr.To("q")
		p.OnEndpointSliceUpdate(nil, es) // the controller follows: q is open, served at once
		if n, sum := samples(t, p); n != 1 || sum < 0.09 || sum > 0.11 {
			t.Fatalf("count %d sum %.3fs, want one 0.1 s sample at once (it waited for a later sync)", n, sum)
		}
	})
}

// Under externalTrafficPolicy: Local with a cluster-wide internal policy,
// every external portal (externalIP, LB IP, NodePort) carries the shortcut
// to the cluster-wide socket, which the renderer gives the node's own and
// the pods' traffic; ClusterIPs do not need it. Nothing else gets one.
func TestExternalLocalShortcutPortals(t *testing.T) {
	local := v1.ServiceInternalTrafficPolicyLocal
	external := func(s *v1.Service) {
		withNodePort(30080)(s)
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ExternalIPs = []string{"203.0.113.7"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.20"}}
	}
	const (
		none    = iota
		cluster // the cluster IP's socket
		second  // the second one
	)
	tests := []struct {
		name string
		svc  svcOpt
		// where external addresses send external clients, and the
		// node and pods (none: no shortcut, they meet the same)
		wantPort, wantShortcut int
	}{
		{"externalTrafficPolicy Local", func(s *v1.Service) {
			external(s)
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}, second, cluster},
		// The cluster IP's socket is node-local, as external clients'
		// must be; the node and pods meet the cluster-wide one.
		{"both policies Local", func(s *v1.Service) {
			external(s)
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = &local
		}, cluster, second},
		{"internalTrafficPolicy Local only", func(s *v1.Service) {
			external(s)
			s.Spec.InternalTrafficPolicy = &local
		}, second, none},
		{"cluster policies", external, cluster, none},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec portalRecorder
			p := newTestProxier(t, Options{IPv4Portals: &rec, NodeName: "node1"})
			p.OnServiceAdd(makeService("web", tt.svc))
			p.Sync()
			ap := p.active[p.lbName("default/web:p")]
			if len(rec.portals) != 4 {
				t.Fatalf("%d portals, want 4 (ClusterIP, externalIP, LB IP, NodePort): %+v", len(rec.portals), rec.portals)
			}
			port := map[int]int{none: 0, cluster: ap.proxyPort, second: ap.externalPort}
			if (tt.wantPort == second || tt.wantShortcut == second) && ap.externalPort == 0 {
				t.Fatalf("no second socket")
			}
			for _, pt := range rec.portals {
				wantPort, wantShortcut := port[tt.wantPort], port[tt.wantShortcut]
				if pt.IP == mustAddr("10.96.0.10") {
					wantPort, wantShortcut = ap.proxyPort, 0
				}
				if pt.ProxyPort != wantPort || pt.ClusterProxyPort != wantShortcut {
					t.Errorf("%v:%d goes to %d, shortcut to %d; want %d, %d (cluster IP's socket %d, second %d)",
						pt.IP, pt.Port, pt.ProxyPort, pt.ClusterProxyPort, wantPort, wantShortcut, ap.proxyPort, ap.externalPort)
				}
			}
		})
	}
}

// Under a Local traffic policy a dual-stack Service's node-local endpoints
// fall back to serving and terminating ones per family, as kube-proxy's
// per-family proxiers each categorize their own family: this node's IPv4
// pod is terminating and its IPv6 pod ready, so IPv4 clients are served by
// the terminating IPv4 pod, not sent to the IPv6 one. Under a Cluster
// policy the IPv4 family has a ready pod elsewhere, which takes over from
// the terminating one.
func TestLocalPolicyFallbackPerFamily(t *testing.T) {
	local := v1.ServiceInternalTrafficPolicyLocal
	dual := func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }
	tests := []struct {
		name         string
		svc          svcOpt
		wantInternal []string
		wantExternal []string // nil: no separate external set
	}{
		{"internalTrafficPolicy Local", func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local },
			[]string{"10.1.0.1", "fd00:1::1"}, nil},
		{"externalTrafficPolicy Local", func(s *v1.Service) {
			withNodePort(30080)(s)
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}, []string{"10.1.0.2", "fd00:1::1"}, []string{"10.1.0.1", "fd00:1::1"}},
		{"both Local", func(s *v1.Service) {
			withNodePort(30080)(s)
			s.Spec.InternalTrafficPolicy = &local
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}, []string{"10.1.0.1", "fd00:1::1"}, nil},
		{"Cluster", withNodePort(30080), []string{"10.1.0.2", "fd00:1::1"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestProxier(t, Options{NodeName: "node1"})
			p.OnServiceAdd(makeService("web", dual, tt.svc))
			// IPv4: this node's pod terminating (still serving), node2's ready.
			v4 := makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080", "10.1.0.2:8080")
			v4.Endpoints[0].Conditions = discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
			v4.Endpoints[0].NodeName = ptr.To("node1")
			v4.Endpoints[1].NodeName = ptr.To("node2")
			// IPv6: this node's pod ready.
			v6 := makeSlice("web", v1.ProtocolTCP, "[fd00:1::1]:8080")
			v6.Name, v6.AddressType = "web-v6", discovery.AddressTypeIPv6
			v6.Endpoints[0].NodeName = ptr.To("node1")
			p.OnEndpointSliceAdd(v4)
			p.OnEndpointSliceAdd(v6)
			p.Sync()
			spn := loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "web"}, Port: "p", Protocol: v1.ProtocolTCP}
			hosts := func(in []string) []string {
				for i := range in {
					in[i] = strings.Trim(strings.TrimSuffix(in[i], ":8080"), "[]")
				}
				return in
			}
			if got := hosts(endpointsOf(t, p, spn)); !slices.Equal(got, tt.wantInternal) {
				t.Errorf("internal endpoints %v, want %v", got, tt.wantInternal)
			}
			if tt.wantExternal == nil {
				return
			}
			if got := hosts(endpointsOf(t, p, externalName(spn))); !slices.Equal(got, tt.wantExternal) {
				t.Errorf("external endpoints %v, want %v", got, tt.wantExternal)
			}
		})
	}
}

// /debug/services shows the second socket of externalTrafficPolicy: Local
// and its node-local endpoints, and drops them when the policy goes back to
// Cluster: the socket was listed nowhere, so with --iptables=false its
// path could not be found (API-server audit).
func TestExternalLocalSocketListed(t *testing.T) {
	p := newTestProxier(t, Options{NodeName: "node1"})
	local := makeService("web", withNodePort(30080))
	local.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	p.OnServiceAdd(local)
	p.OnEndpointSliceAdd(topologySlice(false))
	p.Sync()
	rows := p.DebugServices()
	ap := p.active[p.lbName("default/web:p")]
	if len(rows) != 1 || ap == nil || ap.externalPort == 0 {
		t.Fatalf("rows %+v", rows)
	}
	if want := "127.0.0.1:" + strconv.Itoa(ap.externalPort); rows[0].ExternalProxyAddress != want {
		t.Errorf("externalProxyAddress %q, want %q", rows[0].ExternalProxyAddress, want)
	}
	if got := rows[0].ExternalEndpoints; len(got) != 1 || got[0] != "10.1.0.1:8080" {
		t.Errorf("externalEndpoints %v, want this node's 10.1.0.1:8080", got)
	}
	if len(rows[0].Endpoints) != 3 {
		t.Errorf("endpoints %v, want all three", rows[0].Endpoints)
	}
	p.OnServiceUpdate(local, makeService("web", withNodePort(30080)))
	p.Sync()
	if rows := p.DebugServices(); len(rows) != 1 || rows[0].ExternalProxyAddress != "" || rows[0].ExternalEndpoints != nil {
		t.Errorf("rows after the policy went back to Cluster: %+v", rows)
	}
}

// A dual-stack Service whose endpoints are all IPv4 serves its IPv4
// clients and refuses its IPv6 ones, as kube-proxy's per-family proxiers
// do (the IPv6 one holds no endpoint); the IPv4 endpoints served IPv6
// clients too. A single-stack Service's endpoints still serve a client of
// the other family that reaches its dual-stack socket.
func TestDualStackServiceFamiliesApart(t *testing.T) {
	bs := startBackends(t, "127.0.0.2")
	for _, tt := range []struct {
		name      string
		svc       svcOpt
		v6Refused bool
	}{
		{"dual-stack", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }, true},
		{"single-stack", func(*v1.Service) {}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestProxier(t, Options{BindAddress: netip.MustParseAddr("::")})
			p.OnServiceAdd(makeService("web", tt.svc))
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "127.0.0.2:"+portOf(bs[0].ln.Addr())))
			p.Sync()
			port, ok := p.ProxyPort("default/web:p")
			if !ok {
				t.Fatal("no proxy socket")
			}
			if got, err := askName(t, "127.0.0.1", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err != nil || got != "backend-a" {
				t.Fatalf("IPv4 client: %q, %v", got, err)
			}
			got, err := askName(t, "::1", net.JoinHostPort("::1", strconv.Itoa(port)))
			if tt.v6Refused && err == nil {
				t.Fatalf("IPv6 client of a dual-stack Service with IPv4 endpoints only was served by %q", got)
			}
			if !tt.v6Refused && (err != nil || got != "backend-a") {
				t.Fatalf("IPv6 client of a single-stack Service: %q, %v", got, err)
			}
		})
	}
}

// The external socket's line names the policy that split it: with
// internalTrafficPolicy Local and externalTrafficPolicy Cluster its
// endpoints are every node's, and the line said "node-local endpoints
// (externalTrafficPolicy: Local)".
func TestExternalSocketLineNamesItsPolicy(t *testing.T) {
	local := v1.ServiceInternalTrafficPolicyLocal
	for _, tc := range []struct {
		name string
		svc  svcOpt
		want string
	}{
		{"externalTrafficPolicy Local", func(s *v1.Service) {
			withNodePort(30080)(s)
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}, `"Serving external traffic of service port on node-local endpoints (externalTrafficPolicy: Local)"`},
		{"internalTrafficPolicy Local", func(s *v1.Service) {
			withNodePort(30080)(s)
			s.Spec.InternalTrafficPolicy = &local
		}, `"Serving external traffic of service port on every node's endpoints (externalTrafficPolicy: Cluster; internalTrafficPolicy: Local keeps the cluster IP's on this node)"`},
		{"both Local", func(s *v1.Service) {
			withNodePort(30080)(s)
			s.Spec.InternalTrafficPolicy = &local
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}, `"Serving the node's and pods' traffic to external addresses of service port on every node's endpoints (both traffic policies Local: external clients and the cluster IP keep this node's)"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := captureKlog(t)
			p := newTestProxier(t, Options{NodeName: "node1"})
			p.OnServiceAdd(makeService("web", tc.svc))
			p.OnEndpointSliceAdd(topologySlice(false))
			p.Sync()
			klog.Flush()
			if !strings.Contains(buf.String(), tc.want) {
				t.Errorf("log lacks %s:\n%s", tc.want, buf.String())
			}
		})
	}
}

// A traffic policy changed on a live Service between the split policies
// (either Local, or both) keeps both sockets open, on their ports: the
// connections they serve go on, and only the rules and the endpoint sets
// move. With both Local the second socket has every endpoint (the node's
// and pods' shortcut to external addresses), the cluster IP's this node's.
func TestPolicyChangesBetweenSplitPoliciesKeepSockets(t *testing.T) {
	local := v1.ServiceInternalTrafficPolicyLocal
	policies := func(itp, etp bool) svcOpt {
		return func(s *v1.Service) {
			withNodePort(30080)(s)
			if itp {
				s.Spec.InternalTrafficPolicy = &local
			}
			if etp {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}
		}
	}
	p := newTestProxier(t, Options{NodeName: "node1"})
	old := makeService("web", policies(false, true))
	p.OnServiceAdd(old)
	p.OnEndpointSliceAdd(topologySlice(false))
	p.Sync()
	spn := p.lbName("default/web:p")
	ap := p.active[spn]
	if ap == nil || ap.external == nil {
		t.Fatal("no second socket under externalTrafficPolicy Local")
	}
	sock, ext, port, extPort := ap.socket, ap.external, ap.proxyPort, ap.externalPort
	all := []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"}
	mine := []string{"10.1.0.1"}
	for _, step := range []struct {
		name           string
		itp, etp       bool
		internal, next []string
	}{
		{"both Local", true, true, mine, all},
		{"internalTrafficPolicy Local only", true, false, mine, all},
		{"both Local again", true, true, mine, all},
		{"externalTrafficPolicy Local only", false, true, all, mine},
	} {
		svc := makeService("web", policies(step.itp, step.etp))
		p.OnServiceUpdate(old, svc)
		old = svc
		p.Sync()
		ap := p.active[spn]
		if ap.socket != sock || ap.external != ext || ap.proxyPort != port || ap.externalPort != extPort {
			t.Fatalf("%s: sockets %d, %d, want the same ones on %d, %d", step.name, ap.proxyPort, ap.externalPort, port, extPort)
		}
		if got := endpointsOf(t, p, spn); !slices.Equal(got, step.internal) {
			t.Errorf("%s: cluster IP's endpoints %v, want %v", step.name, got, step.internal)
		}
		if got := endpointsOf(t, p, externalName(spn)); !slices.Equal(got, step.next) {
			t.Errorf("%s: second socket's endpoints %v, want %v", step.name, got, step.next)
		}
	}
}

// A LoadBalancer without node ports (allocateLoadBalancerNodePorts
// false) has no external address until its load balancer's VIP comes
// (ipMode Proxy never gives one): as kube-proxy's ExternallyAccessible, it
// has no external traffic, so no second socket, which no rule led to; its
// cluster IP keeps its endpoints and its healthCheckNodePort is still
// served (kube-proxy's NeedsHealthCheck goes by type). The VIP opens it,
// and the VIP's portal leads there.
func TestExternalSocketOnlyWithAnExternalAddress(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), NodeIP: mustAddr("127.0.0.1")})
	h := &healthRecorder{}
	p := newTestProxier(t, Options{IPv4Portals: rules, NodeName: "node1", ServiceHealth: h})
	pending := makeService("web")
	pending.Spec.Type = v1.ServiceTypeLoadBalancer
	pending.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	pending.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	pending.Spec.HealthCheckNodePort = 31000
	proxyMode := pending.DeepCopy()
	proxyMode.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.10", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)}}
	vip := pending.DeepCopy()
	vip.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.10"}}
	p.OnServiceAdd(pending)
	p.OnEndpointSliceAdd(topologySlice(false))
	p.Sync()
	name := p.lbName("default/web:p")
	for _, step := range []struct {
		what string
		svc  *v1.Service
	}{{"ingress pending", pending}, {"ipMode Proxy", proxyMode}} {
		if step.svc != pending {
			p.OnServiceUpdate(pending, step.svc)
			p.Sync()
		}
		ap := p.active[name]
		if ap == nil {
			t.Fatalf("%s: service port not served", step.what)
		}
		if ap.external != nil || ap.externalPort != 0 {
			t.Fatalf("%s: an external socket no rule leads to (port %d)", step.what, ap.externalPort)
		}
		if got := endpointsOf(t, p, name); len(got) != 3 {
			t.Errorf("%s: cluster IP endpoints %v, want all three", step.what, got)
		}
		if got := h.calls[len(h.calls)-1]; got[types.NamespacedName{Namespace: "default", Name: "web"}] != 31000 {
			t.Errorf("%s: health ports %v, want web on 31000", step.what, got)
		}
		pending = step.svc
	}
	p.OnServiceUpdate(pending, vip)
	p.Sync()
	ap := p.active[name]
	if ap.external == nil || ap.externalPort == 0 {
		t.Fatal("no external socket once the VIP came")
	}
	if nat := natRules(fake); !strings.Contains(nat, "-d 192.0.2.10/32") || !strings.Contains(nat, "127.0.0.1:"+strconv.Itoa(ap.externalPort)) {
		t.Fatalf("VIP not sent to the external socket %d:\n%s", ap.externalPort, nat)
	}
	if got := endpointsOf(t, p, externalName(name)); len(got) != 1 || got[0] != "10.1.0.1" {
		t.Errorf("external endpoints %v, want this node's 10.1.0.1", got)
	}
}

// The second (external) socket is per port, as kube-proxy's
// ExternallyAccessible is: a LoadBalancer without allocated NodePorts whose
// ingress is pending has no external address for a port without a
// nodePort of its own, though another of its ports names one. Decided per
// Service, that port got an external socket no rule led to.
func TestExternalSocketOnlyForAPortWithAnExternalAddress(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), NodeIP: mustAddr("127.0.0.1")})
	p := newTestProxier(t, Options{IPv4Portals: rules, NodeName: "node1"})
	svc := makeService("web")
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = 31000
	svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: "q", Port: 81, Protocol: v1.ProtocolTCP, NodePort: 30081})
	es := topologySlice(false)
	es.Ports = append(es.Ports, discovery.EndpointPort{Name: ptr.To("q"), Port: ptr.To(int32(8081)), Protocol: ptr.To(v1.ProtocolTCP)})
	p.OnServiceAdd(svc)
	p.OnEndpointSliceAdd(es)
	p.Sync()
	for port, want := range map[string]bool{"p": false, "q": true} {
		ap := p.active[p.lbName("default/web:"+port)]
		if ap == nil {
			t.Fatalf("port %s not served", port)
		}
		if got := ap.external != nil; got != want {
			t.Errorf("port %s (nodePort %v): external socket %v (port %d), want %v", port, want, got, ap.externalPort, want)
		}
	}
	// The port's external socket serves this node's endpoint (Local).
	if got := endpointsOf(t, p, externalName(p.lbName("default/web:q"))); len(got) != 1 || got[0] != "10.1.0.1" {
		t.Errorf("port q's external endpoints %v, want this node's 10.1.0.1", got)
	}
}
