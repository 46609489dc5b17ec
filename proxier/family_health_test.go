package proxier

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
)

// okSyncer is a PortalSyncer whose every write succeeds.
type okSyncer struct{}

func (okSyncer) Sync([]iptables.Portal) error { return nil }

// An IPv6 rule write that fails leaves the IPv4 family synced, as
// kube-proxy's per-family proxiers each report their own sync: its
// /healthz status and kubeproxy_sync_proxy_rules_last_timestamp_seconds
// under IPv4 move on, IPv6's stay where they were, and only IPv6 turns
// unhealthy once its change has waited past the timeout. One failed
// family held both back, so an IPv4 alert fired for an ip6tables fault.
func TestFailedFamilyDoesNotHoldBackTheOther(t *testing.T) {
	const timeout = time.Minute
	clk := clocktesting.NewFakeClock(time.Unix(10000, 0))
	health := healthcheck.NewProxierHealth(clk, timeout)
	health.SetFamilies(ipv4Family, ipv6Family)
	p := newTestProxier(t, Options{IPv4Portals: okSyncer{}, IPv6Portals: failSyncer{}, Health: health})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080"))
	p.Sync()
	synced := clk.Now()
	clk.Step(timeout)

	healthy, st := health.Healthy()
	if healthy {
		t.Errorf("healthy with IPv6 failing since %v", synced)
	}
	if got := st.Status[ipv4Family]; !got.Healthy || !got.LastUpdated.Equal(synced) {
		t.Errorf("IPv4 status %+v, want healthy, last updated %v (its rules were written)", got, synced)
	}
	if got := st.Status[ipv6Family]; got.Healthy || !got.LastUpdated.IsZero() {
		t.Errorf("IPv6 status %+v, want unhealthy, never updated", got)
	}
	last := func(family string) float64 {
		mfs, err := p.metrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "kubeproxy_sync_proxy_rules_last_timestamp_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "ip_family" && l.GetValue() == family {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		t.Fatalf("no last_timestamp series under %s", family)
		return 0
	}
	if v := last(ipv4Family); v == 0 {
		t.Errorf("IPv4 last sync timestamp %v, want set: the IPv4 rules were written", v)
	}
	if v := last(ipv6Family); v != 0 {
		t.Errorf("IPv6 last sync timestamp %v, want 0: no IPv6 sync succeeded", v)
	}
}

// A new Service's slice change is programmed, in its slice's family, once
// that family's rules are written: an IPv6 rule write that keeps failing
// held back the IPv4 network programming latency too (observed only when
// every family's write succeeded), as it held back IPv4's last sync time
// (TestFailedFamilyDoesNotHoldBackTheOther). kube-proxy's IPv4 proxier
// records its own. The IPv6 slice's change waits for IPv6's rules.
func TestFailedFamilyDoesNotHoldBackTheOthersProgrammingLatency(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(start)
	v6 := &switchSyncer{}
	v6.failing.Store(true)
	p := newTestProxier(t, Options{Clock: clk, IPv4Portals: okSyncer{}, IPv6Portals: v6})
	stamped := func(es *discovery.EndpointSlice, at time.Time) *discovery.EndpointSlice {
		es.Annotations = map[string]string{endpointsTriggerTimeAnnotation: at.Format(time.RFC3339Nano)}
		return es
	}
	clk.Step(2 * time.Second)
	p.OnEndpointSliceAdd(stamped(makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080"), start.Add(time.Second)))
	v6slice := makeSlice("web", v1.ProtocolTCP, "[fd00:1::1]:8080")
	v6slice.Name, v6slice.AddressType = "web-v6", discovery.AddressTypeIPv6
	p.OnEndpointSliceAdd(stamped(v6slice, start.Add(time.Second)))
	p.OnServiceAdd(makeService("web", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }))
	clk.Step(time.Second)
	p.Sync()
	samples := func(family string) (uint64, float64) {
		var m dto.Metric
		if err := p.metrics.NetworkProgrammingLatency.WithLabelValues(family).(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
	}
	if n, sum := samples(ipv4Family); n != 1 || sum != 2 {
		t.Errorf("IPv4 programming latency count %d sum %.2fs, want one 2 s sample: its rules were written", n, sum)
	}
	if n, _ := samples(ipv6Family); n != 0 {
		t.Errorf("IPv6 programming latency count %d, want 0: its rules were not written", n)
	}
	v6.failing.Store(false)
	clk.Step(time.Second)
	p.Sync()
	if n, sum := samples(ipv6Family); n != 1 || sum != 3 {
		t.Errorf("IPv6 programming latency count %d sum %.2fs, want one 3 s sample once its rules were written", n, sum)
	}
	if n, _ := samples(ipv4Family); n != 1 {
		t.Errorf("IPv4 programming latency count %d, want still 1", n)
	}
}

// A service port that moves to another proxy port while one family's
// rule write fails is no longer served in that family: its rules there
// still name the old port. An IPv6 slice change waiting for it is
// programmed once IPv6's rules are written, not at the sync that moved
// it (the reopen kept the families the old port was open in, so the
// IPv6 sample was taken while IPv6 still sent to a closed port).
func TestMovedPortWaitsForTheFailedFamilysRules(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(start)
	v6 := &switchSyncer{}
	base := freeTCPPorts(t, 3)
	p := newTestProxier(t, Options{Clock: clk, IPv4Portals: okSyncer{}, IPv6Portals: v6,
		ClaimNodePorts: true, PortRange: PortRange{Base: base, Size: 3}})
	dual := func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }
	p.OnServiceAdd(makeService("web", dual))
	v6slice := makeSlice("web", v1.ProtocolTCP, "[fd00:1::1]:8080")
	v6slice.Name, v6slice.AddressType = "web-v6", discovery.AddressTypeIPv6
	p.OnEndpointSliceAdd(v6slice)
	p.Sync()
	taken, ok := p.ProxyPort("default/web:p")
	if !ok {
		t.Fatalf("web has no proxy socket (left undone: %q)", p.lastFailed)
	}

	// IPv6 fails from now on; web moves off its port, now b's NodePort.
	v6.failing.Store(true)
	p.OnServiceAdd(makeService("b", withClusterIP("10.96.0.11"), withNodePort(int32(taken))))
	p.Sync()
	if moved, _ := p.ProxyPort("default/web:p"); moved == taken {
		t.Fatalf("web still on %d, b's NodePort", taken)
	}
	changeStamped(p, clk, v6slice, "fd00:1::2")
	samples := func() uint64 { return latencySamples(t, p, ipv6Family) }
	if n := samples(); n != 0 {
		t.Errorf("IPv6 programming latency count %d, want 0: IPv6's rules still name web's old proxy port %d", n, taken)
	}
	v6.failing.Store(false)
	clk.Step(time.Second)
	p.Sync()
	if n := samples(); n != 1 {
		t.Errorf("IPv6 programming latency count %d, want 1 once IPv6's rules were written", n)
	}
}

// A service port that comes to be served in a family it was not (a
// single-stack Service made dual-stack) while that family's rule write
// fails is not served there yet: no rule of that family names its socket.
// A slice change of that family is programmed once its rules are written,
// not at once: the port had counted as open in that family since a sync
// that wrote both families' rules, when it had none there to write. Made
// dual-stack from IPv4 the socket reopens (on its port) as a dual-stack
// one; from IPv6 it stays.
func TestAddedFamilyWaitsForItsRules(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		from, to             []string
		addressType          discovery.AddressType
		addr, changedAddr    string
		family               string
		failingV4, failingV6 bool
	}{
		{"IPv4 to dual-stack", []string{"10.96.0.10"}, []string{"10.96.0.10", "fd00::10"},
			discovery.AddressTypeIPv6, "[fd00:1::1]:8080", "fd00:1::2", ipv6Family, false, true},
		{"IPv6 to dual-stack", []string{"fd00::10"}, []string{"fd00::10", "10.96.0.10"},
			discovery.AddressTypeIPv4, "10.1.0.1:8080", "10.1.0.2", ipv4Family, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
			v4, v6 := &switchSyncer{}, &switchSyncer{}
			p := newTestProxier(t, Options{Clock: clk, IPv4Portals: v4, IPv6Portals: v6})
			ips := func(ips []string) svcOpt {
				return func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = ips[0], ips }
			}
			single := makeService("web", ips(tc.from))
			p.OnServiceAdd(single)
			slice := makeSlice("web", v1.ProtocolTCP, tc.addr)
			slice.Name, slice.AddressType = "web-other", tc.addressType
			p.OnEndpointSliceAdd(slice)
			p.Sync()
			if _, ok := p.ProxyPort("default/web:p"); !ok {
				t.Fatalf("web has no proxy socket (left undone: %q)", p.lastFailed)
			}

			v4.failing.Store(tc.failingV4)
			v6.failing.Store(tc.failingV6)
			p.OnServiceUpdate(single, makeService("web", ips(tc.to)))
			p.Sync()
			if _, ok := p.ProxyPort("default/web:p"); !ok {
				t.Fatalf("web has no proxy socket after the change (left undone: %q)", p.lastFailed)
			}
			changeStamped(p, clk, slice, tc.changedAddr)
			samples := func() uint64 { return latencySamples(t, p, tc.family) }
			if n := samples(); n != 0 {
				t.Errorf("%s programming latency count %d, want 0: no %s rule names web yet", tc.family, n, tc.family)
			}
			v4.failing.Store(false)
			v6.failing.Store(false)
			clk.Step(time.Second)
			p.Sync()
			if n := samples(); n != 1 {
				t.Errorf("%s programming latency count %d, want 1 once its rules were written", tc.family, n)
			}
		})
	}
}

// A service port reopened on another proxy port because another process
// took its own between the close and the reopen (its fault name changed:
// an unnamed port's number is in it) is, like one moved off a new node
// port, served in no family whose rules still name the old port: an IPv6
// slice change waits for IPv6's rules while ip6tables-restore fails.
func TestReopenedOffATakenPortWaitsForTheFailedFamilysRules(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	v6 := &switchSyncer{}
	p := newTestProxier(t, Options{Clock: clk, IPv4Portals: okSyncer{}, IPv6Portals: v6})
	web := func(port int32) *v1.Service {
		return makeService("web", func(s *v1.Service) {
			s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
			s.Spec.Ports[0].Name, s.Spec.Ports[0].Port = "", port
		})
	}
	old := web(80)
	p.OnServiceAdd(old)
	v6slice := makeSlice("web", v1.ProtocolTCP, "[fd00:1::1]:8080")
	v6slice.Name, v6slice.AddressType = "web-v6", discovery.AddressTypeIPv6
	v6slice.Ports[0].Name = ptr.To("")
	p.OnEndpointSliceAdd(v6slice)
	p.Sync()
	taken, ok := p.ProxyPort("default/web")
	if !ok {
		t.Fatalf("web has no proxy socket (left undone: %q)", p.lastFailed)
	}

	// IPv6 fails from now on; web reopens, and its port is taken meanwhile.
	v6.failing.Store(true)
	listen := p.listen
	p.listen = func(name loadbalancer.ServicePortName, bind netip.Addr, port int, needIPv6 bool, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) (proxySocket, error) {
		if port == taken {
			return nil, fmt.Errorf("listen on port %d: address already in use", port)
		}
		return listen(name, bind, port, needIPv6, sp, fp, cfg)
	}
	p.OnServiceUpdate(old, web(81))
	p.Sync()
	if moved, _ := p.ProxyPort("default/web"); moved == taken || moved == 0 {
		t.Fatalf("web on %d, want another port than %d", moved, taken)
	}
	changeStamped(p, clk, v6slice, "fd00:1::2")
	samples := func() uint64 { return latencySamples(t, p, ipv6Family) }
	if n := samples(); n != 0 {
		t.Errorf("IPv6 programming latency count %d, want 0: IPv6's rules still name web's old proxy port %d", n, taken)
	}
	v6.failing.Store(false)
	clk.Step(time.Second)
	p.Sync()
	if n := samples(); n != 1 {
		t.Errorf("IPv6 programming latency count %d, want 1 once IPv6's rules were written", n)
	}
}

// changeStamped moves slice's first endpoint to addr with a trigger time a
// second on, and syncs a second later.
func changeStamped(p *Proxier, clk *clocktesting.FakeClock, slice *discovery.EndpointSlice, addr string) {
	clk.Step(time.Second)
	changed := slice.DeepCopy()
	changed.Endpoints[0].Addresses = []string{addr}
	changed.Annotations = map[string]string{endpointsTriggerTimeAnnotation: clk.Now().Format(time.RFC3339Nano)}
	p.OnEndpointSliceUpdate(slice, changed)
	clk.Step(time.Second)
	p.Sync()
}

// latencySamples is how many network programming latencies p observed in
// family.
func latencySamples(t *testing.T, p *Proxier, family string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := p.metrics.NetworkProgrammingLatency.WithLabelValues(family).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
