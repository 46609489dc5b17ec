package proxier

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

func newPortalProxier(t *testing.T) (*Proxier, *iptables.FakeRunner) {
	t.Helper()
	p, fake := newPortalProxierUnsynced(t)
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	return p, fake
}

func newPortalProxierUnsynced(t *testing.T) (*Proxier, *iptables.FakeRunner) {
	t.Helper()
	fake := iptables.NewFakeRunner(iptables.IPv4)
	rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), NodeIP: mustAddr("127.0.0.1")})
	p := New(Options{IPv4Portals: rules, BindAddress: mustAddr("127.0.0.1")})
	t.Cleanup(func() { stopNow(p) })
	return p, fake
}

func natRules(f *iptables.FakeRunner) string {
	var b strings.Builder
	for _, chain := range []string{"KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST", "KUBE-NODEPORT-CONTAINER", "KUBE-NODEPORT-HOST"} {
		for _, r := range f.Rules("nat", chain) {
			b.WriteString(chain + " " + r + "\n")
		}
	}
	return b.String()
}

// Endpoint changes are balancer state only: the rules, and the number of
// iptables-restore calls, must not move (the seed-004 outage came from
// endpoint changes waiting behind a full rule rewrite).
func TestEndpointChangesNeverTouchIPTables(t *testing.T) {
	p, fake := newPortalProxier(t)
	p.OnServiceAdd(makeService("web", withNodePort(30080)))
	p.Sync()
	before := natRules(fake)
	writes := len(fake.Writes())
	if !strings.Contains(before, "10.96.0.10/32") || !strings.Contains(before, "--dport 30080") {
		t.Fatalf("portal rules missing ClusterIP or NodePort:\n%s", before)
	}

	slice := makeSlice("web", v1.ProtocolTCP, "127.0.0.2:8080")
	p.OnEndpointSliceAdd(slice)
	p.OnEndpointSliceUpdate(slice, makeSlice("web", v1.ProtocolTCP, "127.0.0.3:8080", "127.0.0.4:8080"))
	p.OnEndpointSliceDelete(slice)
	if len(fake.Writes()) != writes {
		t.Fatalf("endpoint events wrote iptables %d times", len(fake.Writes())-writes)
	}
	p.Sync()
	if got := natRules(fake); got != before {
		t.Fatalf("rules changed after endpoint-only changes:\nbefore:\n%s\nafter:\n%s", before, got)
	}
	if len(fake.Writes()) != writes {
		t.Fatalf("a sync with no Service change restored iptables")
	}
}

func TestServiceChangesRewritePortals(t *testing.T) {
	p, fake := newPortalProxier(t)
	svc := makeService("web")
	p.OnServiceAdd(svc)
	p.Sync()
	if !strings.Contains(natRules(fake), "10.96.0.10/32") {
		t.Fatalf("no ClusterIP portal:\n%s", natRules(fake))
	}
	moved := makeService("web", withClusterIP("10.96.0.99"))
	p.OnServiceUpdate(svc, moved)
	p.Sync()
	got := natRules(fake)
	if strings.Contains(got, "10.96.0.10/32") || !strings.Contains(got, "10.96.0.99/32") {
		t.Fatalf("ClusterIP change not programmed:\n%s", got)
	}
	p.OnServiceDelete(moved)
	p.Sync()
	if got := natRules(fake); got != "" {
		t.Fatalf("removed Service left rules:\n%s", got)
	}
}

// The proxy socket of a service port survives a change of its rules, so
// established connections and the proxy port stay.
func TestServiceChangeKeepsProxyPort(t *testing.T) {
	p, _ := newPortalProxier(t)
	svc := makeService("web")
	p.OnServiceAdd(svc)
	p.Sync()
	port1, _ := p.ProxyPort("default/web:p")
	p.OnServiceUpdate(svc, makeService("web", withClusterIP("10.96.0.99"), withClientIPAffinity(3)))
	p.Sync()
	port2, _ := p.ProxyPort("default/web:p")
	if port1 != port2 {
		t.Fatalf("proxy port moved from %d to %d on a rules-only change", port1, port2)
	}
	if rows := p.DebugServices(); rows[0].TimeoutSec != 3 {
		t.Fatalf("affinity timeout change not applied: %+v", rows[0])
	}
}

// newFakeClockProxier is a synced proxier on fake IPv4 iptables and a fake
// clock, with a sync period of 30 s.
func newFakeClockProxier(t *testing.T) (*Proxier, *iptables.FakeRunner, *clocktesting.FakeClock) {
	t.Helper()
	fake := iptables.NewFakeRunner(iptables.IPv4)
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1")})
	p := New(Options{IPv4Portals: rules, BindAddress: mustAddr("127.0.0.1"), Clock: clk, SyncPeriod: 30 * time.Second})
	t.Cleanup(func() { stopNow(p) })
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	return p, fake, clk
}

// A Service change is written as a delta without reading the rules back;
// the rules someone deleted by hand come back with the next full sync:
// the periodic one, or the first change-driven one once a sync period
// passed without one (constant churn keeps the periodic timer from ever
// firing).
func TestChangeSyncsWriteDeltasAndFullSyncsRepair(t *testing.T) {
	p, fake, clk := newFakeClockProxier(t)
	p.OnServiceAdd(makeService("web", withNodePort(30080)))
	p.OnServiceAdd(makeService("api", withClusterIP("10.96.0.20")))
	p.Sync() // the first sync is full
	want := natRules(fake)

	saves := func() int { return fake.CallsOf("Save") }
	// Someone deletes web's ClusterIP rule; then api changes.
	deleteRule := func() {
		t.Helper()
		for _, r := range fake.Rules("nat", "KUBE-PORTALS-HOST") {
			if strings.Contains(r, "default/web:p") {
				if err := fake.Restore([]byte("*nat\n-D KUBE-PORTALS-HOST " + r + "\nCOMMIT\n")); err != nil {
					t.Fatal(err)
				}
				return
			}
		}
		t.Fatalf("no rule of web in KUBE-PORTALS-HOST:\n%s", natRules(fake))
	}
	deleteRule()
	fake.ResetCalls()
	clk.Step(10 * time.Second)
	p.OnServiceUpdate(nil, makeService("api", withClusterIP("10.96.0.21")))
	p.Sync()
	got := natRules(fake)
	if n := saves(); n != 0 || len(fake.Writes()) != 1 {
		t.Errorf("change sync: %d reads, %d writes; want 0 and 1 (a delta)", n, len(fake.Writes()))
	}
	if !strings.Contains(got, "10.96.0.21/32") || strings.Contains(got, "10.96.0.20/32") {
		t.Fatalf("api's change not programmed:\n%s", got)
	}
	if strings.Count(got, "default/web:p") != strings.Count(want, "default/web:p")-1 {
		t.Fatalf("a change sync repaired the rule deleted by hand (it must not read back):\n%s", got)
	}

	// The periodic sync repairs.
	p.SyncFull()
	if got := natRules(fake); strings.Count(got, "default/web:p") != strings.Count(want, "default/web:p") {
		t.Fatalf("periodic sync did not restore the deleted rule:\n%s", got)
	}

	// Changes every 10 s: the one a sync period after the last full sync
	// is full again, and repairs.
	deleteRule()
	for i := range 3 {
		clk.Step(10 * time.Second)
		p.OnServiceUpdate(nil, makeService("api", withClusterIP("10.96.0."+strconv.Itoa(30+i))))
		p.Sync()
	}
	if got := natRules(fake); strings.Count(got, "default/web:p") != strings.Count(want, "default/web:p") {
		t.Fatalf("no full sync within a sync period of churn:\n%s", got)
	}
}

// TestNodePortOnlyOnTheServicesFamilies: a Service's NodePort is opened on
// the families it has, as kube-proxy's per-family proxiers do: an IPv6-only
// Service's NodePort was also served on every IPv4 address of the node.
func TestNodePortOnlyOnTheServicesFamilies(t *testing.T) {
	for _, tt := range []struct {
		name           string
		clusterIPs     []string
		wantV4, wantV6 bool
	}{
		{"IPv4 only", []string{"10.96.0.10"}, true, false},
		{"IPv6 only", []string{"fd00::10"}, false, true},
		{"dual-stack", []string{"10.96.0.10", "fd00::10"}, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v4, v6 := &portalRecorder{}, &portalRecorder{}
			p := newSyncedPlanProxier(t, Options{IPv4Portals: v4, IPv6Portals: v6})
			svc := makeService("web", withNodePort(30080))
			svc.Spec.ClusterIP, svc.Spec.ClusterIPs = tt.clusterIPs[0], tt.clusterIPs
			p.OnServiceAdd(svc)
			p.Sync()
			hasNodePort := func(ps []iptables.Portal) bool {
				return slices.ContainsFunc(ps, func(p iptables.Portal) bool { return p.NodePort })
			}
			if got := hasNodePort(v4.portals); got != tt.wantV4 {
				t.Errorf("IPv4 NodePort portal %v, want %v (%+v)", got, tt.wantV4, v4.portals)
			}
			if got := hasNodePort(v6.portals); got != tt.wantV6 {
				t.Errorf("IPv6 NodePort portal %v, want %v (%+v)", got, tt.wantV6, v6.portals)
			}
		})
	}
}

// TestNodePortInTheClusterIPsFamilies: a NodePort is served in the families
// of the Service's ClusterIPs, as kube-proxy's per-family proxiers, not in
// those of its externalIPs or LoadBalancer IPs: an IPv4-only Service with an
// IPv6 externalIP opened its NodePort on every IPv6 address of the node.
// Those addresses get no portal either (TestServiceAddressFamilies), unless
// the Service has no ClusterIP.
func TestNodePortInTheClusterIPsFamilies(t *testing.T) {
	for _, tt := range []struct {
		name           string
		clusterIPs     []string
		externalIPs    []string
		lbIPs          []string
		wantV4, wantV6 bool
	}{
		{"IPv4 Service, IPv6 externalIP", []string{"10.96.0.10"}, []string{"2001:db8::5"}, nil, true, false},
		{"IPv4 Service, IPv6 LB IP", []string{"10.96.0.10"}, nil, []string{"2001:db8::1"}, true, false},
		{"IPv6 Service, IPv4 externalIP and LB IP", []string{"fd00::10"}, []string{"192.0.2.5"}, []string{"198.51.100.1"}, false, true},
		{"dual-stack Service, IPv4 externalIP", []string{"10.96.0.10", "fd00::10"}, []string{"192.0.2.5"}, nil, true, true},
		{"no ClusterIP, IPv6 externalIP", nil, []string{"2001:db8::5"}, nil, false, true},
		{"no ClusterIP, no other address", nil, nil, nil, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v4, v6 := &portalRecorder{}, &portalRecorder{}
			p := newSyncedPlanProxier(t, Options{IPv4Portals: v4, IPv6Portals: v6})
			svc := makeService("web", withNodePort(30080))
			svc.Spec.Type = v1.ServiceTypeLoadBalancer
			svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "", tt.clusterIPs
			if len(tt.clusterIPs) > 0 {
				svc.Spec.ClusterIP = tt.clusterIPs[0]
			}
			svc.Spec.ExternalIPs = tt.externalIPs
			for _, ip := range tt.lbIPs {
				svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
			}
			p.OnServiceAdd(svc)
			p.Sync()
			addrs := map[netip.Addr]bool{}
			for _, portal := range slices.Concat(v4.portals, v6.portals) {
				if !portal.NodePort {
					addrs[portal.IP] = true
				}
			}
			hasNodePort := func(ps []iptables.Portal) bool {
				return slices.ContainsFunc(ps, func(p iptables.Portal) bool { return p.NodePort })
			}
			if got := hasNodePort(v4.portals); got != tt.wantV4 {
				t.Errorf("IPv4 NodePort portal %v, want %v (%+v)", got, tt.wantV4, v4.portals)
			}
			if got := hasNodePort(v6.portals); got != tt.wantV6 {
				t.Errorf("IPv6 NodePort portal %v, want %v (%+v)", got, tt.wantV6, v6.portals)
			}
			// An address has a portal when its family is one of the
			// ClusterIPs' (any family without ClusterIPs).
			for _, s := range slices.Concat(tt.clusterIPs, tt.externalIPs, tt.lbIPs) {
				a := netip.MustParseAddr(s)
				want := len(tt.clusterIPs) == 0 || a.Is4() && tt.wantV4 || a.Is6() && tt.wantV6
				if addrs[a] != want {
					t.Errorf("portal for %s: %v, want %v: %+v %+v", s, addrs[a], want, v4.portals, v6.portals)
				}
			}
		})
	}
}

// TestLoadBalancerSourceRanges: a LoadBalancer Service's
// loadBalancerSourceRanges go with its LB-IP portals of each family (entries
// trimmed as kube-proxy trims them), never with its ClusterIP or NodePort,
// and a change of the ranges alone rewrites the portals.
func TestLoadBalancerSourceRanges(t *testing.T) {
	v4, v6 := &portalRecorder{}, &portalRecorder{}
	p := newSyncedPlanProxier(t, Options{IPv4Portals: v4, IPv6Portals: v6})
	lb := func(ranges ...string) *v1.Service {
		svc := makeService("web", withNodePort(30080))
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
		svc.Spec.LoadBalancerSourceRanges = ranges
		svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.1"}, {IP: "2001:db8::1"}}
		return svc
	}
	rangesOf := func(ps []iptables.Portal) map[string][]netip.Prefix {
		out := map[string][]netip.Prefix{}
		for _, p := range ps {
			key := p.IP.String()
			if p.NodePort {
				key = "nodeport"
			}
			out[key] = p.SourceRanges
		}
		return out
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00:10::/64")}
	old := lb(" 10.1.2.3/16", "fd00:10::/64 ")
	p.OnServiceAdd(old)
	p.Sync()
	for _, got := range []map[string][]netip.Prefix{rangesOf(v4.portals), rangesOf(v6.portals)} {
		for key, ranges := range got {
			lbIP := key == "198.51.100.1" || key == "2001:db8::1"
			if lbIP && !slices.Equal(ranges, want) || !lbIP && ranges != nil {
				t.Errorf("portal %s has source ranges %v (all: %v)", key, ranges, got)
			}
		}
	}
	if n := len(v4.portals) + len(v6.portals); n != 6 {
		t.Errorf("%d portals, want 6: %+v %+v", n, v4.portals, v6.portals)
	}

	p.OnServiceUpdate(old, lb("10.2.0.0/16"))
	p.Sync()
	if got := rangesOf(v4.portals)["198.51.100.1"]; !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}) {
		t.Errorf("after the ranges changed, the LB portal has %v, want 10.2.0.0/16", got)
	}

	// An LB IP that is also an externalIP is an externalIP: kube-proxy
	// captures externalIPs first, straight to the Service, so its LB
	// firewall never sees them and every source is served. With the
	// ranges on an LB portal of the same address, clients outside them
	// were dropped.
	both := lb("10.2.0.0/16")
	both.Spec.ExternalIPs = []string{"198.51.100.1"}
	p.OnServiceUpdate(lb("10.2.0.0/16"), both)
	p.Sync()
	for _, portal := range v4.portals {
		if portal.IP == netip.MustParseAddr("198.51.100.1") && portal.SourceRanges != nil {
			t.Errorf("198.51.100.1, an externalIP and an LB IP, has source ranges %v: %+v", portal.SourceRanges, v4.portals)
		}
	}
}

// With portals of one family only (the node has no ip6tables nat table: see
// iptables.Present), a Service of only the other family gets no portal:
// that is logged once per Service, not per sync or update, and not for a
// dual-stack Service, which is served in the family that works.
func TestServiceOfAnUnsupportedFamilyLoggedOnce(t *testing.T) {
	logs := captureKlog(t)
	v4 := &portalRecorder{}
	p := newSyncedPlanProxier(t, Options{IPv4Portals: v4})
	six := makeService("six", withNodePort(30080))
	six.Spec.ClusterIP, six.Spec.ClusterIPs = "fd00::10", []string{"fd00::10"}
	dual := makeService("dual")
	dual.Spec.ClusterIP, dual.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11", "fd00::11"}
	p.OnServiceAdd(six)
	p.OnServiceAdd(dual)
	p.Sync()
	changed := six.DeepCopy()
	changed.Labels = map[string]string{"changed": "yes"}
	p.OnServiceUpdate(six, changed)
	p.SyncFull()
	klog.Flush()
	const line = "Service gets no portal"
	if n := strings.Count(logs.String(), line); n != 1 || !strings.Contains(logs.String(), `service="default/six" ipFamily="IPv6"`) {
		t.Errorf("%q logged %d times, want once for default/six; log:\n%s", line, n, logs)
	}
	if got := len(v4.portals); got != 1 || v4.portals[0].IP != netip.MustParseAddr("10.96.0.11") {
		t.Errorf("IPv4 portals %+v, want dual's ClusterIP only", v4.portals)
	}
}

// The log line for a Service of the family without portals names the
// cause: a bind address of the other family (the command drops that
// family's syncer for it) or the node's netfilter. With --bind-address
// fd77::1 an IPv4 Service was said to lack "iptables support for its IP
// family on this node", which the node had.
func TestNoPortalLogNamesTheCause(t *testing.T) {
	for _, tc := range []struct {
		name      string
		bind      string
		v4, v6    bool
		clusterIP string
		want      string
	}{
		{"no ip6tables", "", true, false, "fd00::10", "no iptables support for its IP family on this node"},
		{"no ip6tables, all IPv4 addresses", "0.0.0.0", true, false, "fd00::10", "no iptables support for its IP family on this node"},
		{"IPv6 bind address", "fd77::1", false, true, "10.96.0.10", `the bind address is of the other IP family (proxy sockets on one address cannot take this family's traffic)" service="default/other" ipFamily="IPv4" bindAddress="fd77::1"`},
		{"IPv4 bind address", "10.0.0.5", true, false, "fd00::10", `the bind address is of the other IP family (proxy sockets on one address cannot take this family's traffic)" service="default/other" ipFamily="IPv6" bindAddress="10.0.0.5"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := captureKlog(t)
			opts := Options{}
			if tc.bind != "" {
				opts.BindAddress = netip.MustParseAddr(tc.bind)
			}
			if tc.v4 {
				opts.IPv4Portals = &portalRecorder{}
			}
			if tc.v6 {
				opts.IPv6Portals = &portalRecorder{}
			}
			p := newSyncedPlanProxier(t, opts)
			svc := makeService("other")
			svc.Spec.ClusterIP, svc.Spec.ClusterIPs = tc.clusterIP, []string{tc.clusterIP}
			p.OnServiceAdd(svc)
			p.Sync()
			klog.Flush()
			if !strings.Contains(logs.String(), "Service gets no portal and is not served: "+tc.want) {
				t.Errorf("log does not say %q:\n%s", tc.want, logs)
			}
		})
	}
}

// With portals of one family only (the node's netfilter lacks the other:
// see iptables.Present), a service port whose every address is of the
// other family is not served at all, as kube-proxy, which has no proxier
// for that family: no proxy socket (nor external one), no balancer entry,
// no healthCheckNodePort (nor NodePort claim, which belongs to the open
// port); traffic could reach none of them. A dual-stack Service is served
// in the family that works, a change of family opens or closes the port,
// and without any syncer (--iptables=false) every port is served on its
// socket.
func TestServiceOfAnUnsupportedFamilyNotServed(t *testing.T) {
	v4only, v6only, dual := []string{"10.96.0.10"}, []string{"fd00::10"}, []string{"10.96.0.10", "fd00::10"}
	type step struct {
		clusterIPs []string
		served     bool
	}
	for _, tt := range []struct {
		name   string
		v4, v6 bool // the families with a portal syncer
		steps  []step
	}{
		{"IPv6-only Service, no IPv6 netfilter", true, false, []step{{v6only, false}}},
		{"IPv4-only Service, no IPv4 netfilter", false, true, []step{{v4only, false}}},
		{"dual-stack Service, no IPv6 netfilter", true, false, []step{{dual, true}}},
		{"IPv4-only Service, no IPv6 netfilter", true, false, []step{{v4only, true}}},
		{"IPv6-only Service, both families", true, true, []step{{v6only, true}}},
		{"IPv6-only Service, --iptables=false", false, false, []step{{v6only, true}}},
		{"IPv6-only turns dual-stack and back", true, false, []step{{v6only, false}, {dual, true}, {v6only, false}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v4, v6, health := &portalRecorder{}, &portalRecorder{}, &healthRecorder{}
			opts := Options{ServiceHealth: health}
			if tt.v4 {
				opts.IPv4Portals = v4
			}
			if tt.v6 {
				opts.IPv6Portals = v6
			}
			p := New(opts)
			t.Cleanup(func() { stopNow(p) })
			listened := 0
			p.listen = func(_ loadbalancer.ServicePortName, _ netip.Addr, port int, _ bool, _ *loadbalancer.ServicePort, _ *faults.Port, _ *socketConfig) (proxySocket, error) {
				listened++
				return planSocket(40000 + listened), nil
			}
			p.OnServiceSynced()
			p.OnEndpointSlicesSynced()
			var prev *v1.Service
			for i, st := range tt.steps {
				svc := localLB("web", 32000)
				svc.Spec.ClusterIP, svc.Spec.ClusterIPs = st.clusterIPs[0], st.clusterIPs
				svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: st.clusterIPs[0]}}
				if prev == nil {
					p.OnServiceAdd(svc)
				} else {
					p.OnServiceUpdate(prev, svc)
				}
				prev = svc
				listened = 0
				p.Sync()
				name := servicePortName("web")
				_, active := p.active[name]
				lbNames := p.lb.ServicePortNames()
				inLB := slices.Contains(lbNames, name) || slices.Contains(lbNames, externalName(name))
				healthPorts := map[types.NamespacedName]int{}
				if n := len(health.calls); n > 0 {
					healthPorts = health.calls[n-1]
				}
				_, healthChecked := healthPorts[name.NamespacedName]
				portals := len(v4.portals) + len(v6.portals)
				if st.served {
					if !active || !inLB || !healthChecked || (tt.v4 || tt.v6) && portals == 0 {
						t.Errorf("step %d (%v): served %v, balancer entry %v, health check %v, %d portals; want all", i, st.clusterIPs, active, inLB, healthChecked, portals)
					}
					continue
				}
				if active || listened != 0 || inLB || healthChecked || portals != 0 {
					t.Errorf("step %d (%v): served %v (%d sockets opened), balancer entries %v, health checks %v, %d portals; want none", i, st.clusterIPs, active, listened, lbNames, healthPorts, portals)
				}
			}
		})
	}
}

// newSyncedPlanProxier is a proxier with both sources synced whose sockets
// are plans (planSocket), no listening, for tests of what a sync decides.
func newSyncedPlanProxier(t *testing.T, opts Options) *Proxier {
	t.Helper()
	p := New(opts)
	t.Cleanup(func() { stopNow(p) })
	p.listen = func(_ loadbalancer.ServicePortName, _ netip.Addr, port int, _ bool, _ *loadbalancer.ServicePort, _ *faults.Port, _ *socketConfig) (proxySocket, error) {
		return planSocket(40000), nil
	}
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	return p
}

// RepairSoon makes the next sync a full one, which reads the rules back
// and repairs them, whenever it comes: a proxy that took over from one it
// overlapped (whose last sync left the rules naming its ports) repairs at
// once, not a sync period later.
func TestRepairSoonMakesTheNextSyncFull(t *testing.T) {
	p, fake, clk := newFakeClockProxier(t)
	p.OnServiceAdd(makeService("web"))
	p.Sync()
	want := natRules(fake)
	for _, r := range fake.Rules("nat", "KUBE-PORTALS-HOST") {
		if err := fake.Restore([]byte("*nat\n-D KUBE-PORTALS-HOST " + r + "\nCOMMIT\n")); err != nil {
			t.Fatal(err)
		}
	}
	clk.Step(time.Second)
	p.Sync()
	if natRules(fake) == want {
		t.Fatal("a change sync repaired the flushed chain: the test shows nothing")
	}
	p.RepairSoon()
	p.Sync()
	if got := natRules(fake); got != want {
		t.Fatalf("the sync after RepairSoon did not repair:\n%s\nwant:\n%s", got, want)
	}
}
