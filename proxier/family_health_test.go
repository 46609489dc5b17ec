package proxier

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
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
