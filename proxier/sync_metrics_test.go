package proxier

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// kube-proxy's sync series that dashboards and alerts read beside
// sync_proxy_rules_duration_seconds: the full and partial sync durations and
// the time the last sync was queued.
func TestSyncDurationsFullAndPartial(t *testing.T) {
	p := newTestProxier(t, Options{})
	if got := testutil.ToFloat64(p.metrics.SyncProxyRulesLastQueued.WithLabelValues("IPv4")); got != 0 {
		t.Fatalf("last queued %v before any change, want 0", got)
	}
	p.OnServiceAdd(makeService("web"))
	if got := testutil.ToFloat64(p.metrics.SyncProxyRulesLastQueued.WithLabelValues("IPv4")); got == 0 {
		t.Fatalf("last queued not set by a Service change")
	}
	p.Sync() // the first sync is a full one
	p.OnServiceAdd(makeService("db", withClusterIP("10.96.0.20")))
	p.Sync() // a change within the sync period: partial
	p.SyncFull()
	full := histogramCount(t, p, "kubeproxy_sync_full_proxy_rules_duration_seconds")
	partial := histogramCount(t, p, "kubeproxy_sync_partial_proxy_rules_duration_seconds")
	all := histogramCount(t, p, "kubeproxy_sync_proxy_rules_duration_seconds")
	if full != 2 || partial != 1 || all != 3 {
		t.Fatalf("full %d, partial %d, all %d syncs; want 2, 1, 3", full, partial, all)
	}
}

func histogramCount(t *testing.T, p *Proxier, name string) uint64 {
	t.Helper()
	mfs, err := p.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("%s not exported", name)
	return 0
}

// kubeproxy_sync_proxy_rules_no_local_endpoints_total counts the service
// ports with a Local policy that have endpoints, none of them usable on
// this node (their traffic is refused here), by traffic_policy, and follows
// endpoint changes without a sync.
func TestNoLocalEndpointsMetric(t *testing.T) {
	local := v1.ServiceInternalTrafficPolicyLocal
	p := newTestProxier(t, Options{NodeName: "node1"})
	gauge := func(policy string) float64 {
		return testutil.ToFloat64(p.metrics.NoLocalEndpoints.WithLabelValues(policy, "IPv4"))
	}
	check := func(step string, internal, external float64) {
		t.Helper()
		if gi, ge := gauge("internal"), gauge("external"); gi != internal || ge != external {
			t.Errorf("%s: internal %v, external %v; want %v, %v", step, gi, ge, internal, external)
		}
	}
	check("start", 0, 0)

	p.OnServiceAdd(makeService("web", func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local }))
	p.OnServiceAdd(makeService("lb", withClusterIP("10.96.0.20"), withNodePort(30080), func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}))
	p.Sync()
	check("no endpoints at all (not counted, as kube-proxy)", 0, 0)

	remote := makeSlice("web", v1.ProtocolTCP, "10.1.0.2:8080")
	remote.Endpoints[0].NodeName = ptr.To("node2")
	p.OnEndpointSliceAdd(remote)
	lbRemote := makeSlice("lb", v1.ProtocolTCP, "10.1.0.3:8080")
	lbRemote.Endpoints[0].NodeName = ptr.To("node2")
	p.OnEndpointSliceAdd(lbRemote)
	check("endpoints only on node2", 1, 1)

	here := remote.DeepCopy()
	here.Endpoints[0].NodeName = ptr.To("node1")
	p.OnEndpointSliceUpdate(remote, here)
	check("web's endpoint moved here", 0, 1)

	notReady := here.DeepCopy()
	notReady.Endpoints[0].Conditions.Ready = ptr.To(false)
	p.OnEndpointSliceUpdate(here, notReady)
	check("web's local endpoint not ready (and so usable nowhere)", 0, 1)

	p.OnServiceDelete(makeService("lb", withClusterIP("10.96.0.20")))
	p.Sync()
	check("lb deleted", 0, 0)
}

// kube-proxy's iptables series: the rules our chains hold per table, the
// rules the last sync wrote per table (a partial sync writes only the
// changed ones, a sync with nothing to change none), and the incremental
// (partial) restores iptables refused, each of which fell back to a full
// rewrite.
func TestIPTablesRuleMetrics(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), NodeIP: mustAddr("127.0.0.1")})
	p := newTestProxier(t, Options{IPv4Portals: rules})
	p.OnServiceAdd(makeService("web", withNodePort(30080)))
	p.Sync()
	held := func(table string) int {
		n := 0
		for _, chain := range fake.Chains(iptables.Table(table)) {
			if strings.HasPrefix(chain, "KUBE-") {
				n += len(fake.Rules(iptables.Table(table), chain))
			}
		}
		return n
	}
	// written counts the rules the restores and iptables -I/-A calls
	// since the last check added, per table: what kube-proxy's
	// sync_proxy_rules_iptables_last counts in its restore input.
	written := func(table string) int {
		n := 0
		for _, w := range fake.Writes() {
			in := ""
			for line := range strings.Lines(string(w)) {
				switch {
				case strings.HasPrefix(line, "*"):
					in = strings.TrimSpace(line[1:])
				case in == table && (strings.HasPrefix(line, "-A ") || strings.HasPrefix(line, "-I ")):
					n++
				}
			}
		}
		for _, c := range fake.Calls() {
			if f := strings.Fields(c); len(f) > 1 && (f[0] == "InsertRule" || f[0] == "AppendRule") && f[1] == table {
				n++
			}
		}
		return n
	}
	check := func(step string, partial float64) (lastFilter, lastNat int) {
		t.Helper()
		lastFilter, lastNat = written("filter"), written("nat")
		want := fmt.Sprintf(`
# HELP kubeproxy_sync_proxy_rules_iptables_last Number of iptables rules written by kube-proxy in last sync
# TYPE kubeproxy_sync_proxy_rules_iptables_last gauge
kubeproxy_sync_proxy_rules_iptables_last{ip_family="IPv4",table="filter"} %d
kubeproxy_sync_proxy_rules_iptables_last{ip_family="IPv4",table="nat"} %d
# HELP kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total Cumulative proxy iptables partial restore failures
# TYPE kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total counter
kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv4"} %v
# HELP kubeproxy_sync_proxy_rules_iptables_total Total number of iptables rules owned by kube-proxy
# TYPE kubeproxy_sync_proxy_rules_iptables_total gauge
kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="filter"} %d
kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"} %d
`, lastFilter, lastNat, partial, held("filter"), held("nat"))
		if err := testutil.GatherAndCompare(p.metrics.Registry, strings.NewReader(want),
			"kubeproxy_sync_proxy_rules_iptables_total", "kubeproxy_sync_proxy_rules_iptables_last",
			"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"); err != nil {
			t.Errorf("%s: %v", step, err)
		}
		fake.ResetCalls()
		return lastFilter, lastNat
	}
	if held("nat") == 0 || held("filter") == 0 {
		t.Fatalf("the fake holds no rules: nat %d, filter %d", held("nat"), held("filter"))
	}
	if filter, nat := check("first sync", 0); filter < held("filter") || nat < held("nat") {
		t.Errorf("the first sync wrote filter %d, nat %d rules: fewer than our chains hold (%d, %d)", filter, nat, held("filter"), held("nat"))
	}

	p.OnServiceAdd(makeService("db", withClusterIP("10.96.0.20")))
	p.Sync()
	if filter, nat := check("a Service added (partial sync)", 0); nat == 0 || nat >= held("nat") || filter >= held("filter") {
		t.Errorf("a partial sync wrote filter %d, nat %d rules: want only the new Service's (our chains hold %d, %d)", filter, nat, held("filter"), held("nat"))
	}

	p.Sync()
	if filter, nat := check("a sync with nothing to change", 0); filter != 0 || nat != 0 {
		t.Errorf("a sync with nothing to change wrote filter %d, nat %d rules", filter, nat)
	}

	fake.SetError("Restore", errors.New("iptables-restore: line 3 failed"))
	p.OnServiceDelete(makeService("db", withClusterIP("10.96.0.20")))
	p.Sync()
	fake.SetError("Restore", nil)
	check("a refused partial restore (the counts stay as last written; the sync wrote nothing)", 1)
}

// failSyncer is a PortalSyncer whose every write fails.
type failSyncer struct{}

func (failSyncer) Sync([]iptables.Portal) error { return errors.New("iptables-restore: exit status 1") }

// kube-proxy (k8s.io/kubernetes pkg/proxy/metrics, v1.37) labels its sync
// series with ip_family, each of its per-family proxiers exporting its own,
// so alerts and dashboards select or group by it: one sync here covers both
// families and is recorded under each; a restore failure under the family
// whose write failed; the programming latency under the slice's family.
func TestSyncMetricsCarryIPFamily(t *testing.T) {
	p := newTestProxier(t, Options{IPv6Portals: failSyncer{}})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080"))
	p.Sync()
	mfs, err := p.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]float64{} // name -> ip_family -> count or value
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			family := "(none)"
			for _, l := range m.GetLabel() {
				if l.GetName() == "ip_family" {
					family = l.GetValue()
				}
			}
			if got[mf.GetName()] == nil {
				got[mf.GetName()] = map[string]float64{}
			}
			switch {
			case m.GetHistogram() != nil:
				got[mf.GetName()][family] += float64(m.GetHistogram().GetSampleCount())
			case m.GetCounter() != nil:
				got[mf.GetName()][family] += m.GetCounter().GetValue()
			default:
				got[mf.GetName()][family] += m.GetGauge().GetValue()
			}
		}
	}
	for _, name := range []string{
		"kubeproxy_sync_proxy_rules_duration_seconds",
		"kubeproxy_sync_full_proxy_rules_duration_seconds",
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
	} {
		if got[name]["IPv4"] == 0 || got[name]["IPv6"] == 0 {
			t.Errorf("%s: %v, want a sample under ip_family IPv4 and IPv6", name, got[name])
		}
	}
	for _, name := range []string{
		"kubeproxy_sync_partial_proxy_rules_duration_seconds",
		"kubeproxy_network_programming_duration_seconds",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
	} {
		if _, ok := got[name]["IPv4"]; !ok {
			t.Errorf("%s: %v, want series under ip_family IPv4 and IPv6", name, got[name])
		}
	}
	if f := got["kubeproxy_sync_proxy_rules_iptables_restore_failures_total"]; f["IPv6"] != 1 || f["IPv4"] != 0 || len(f) != 2 {
		t.Errorf("restore failures %v, want 1 under IPv6 and 0 under IPv4", f)
	}
	if n := got["kubeproxy_sync_proxy_rules_no_local_endpoints_total"]; len(n) != 2 {
		t.Errorf("no_local_endpoints families %v, want IPv4 and IPv6", n)
	}
}

// noLocalPorts.add counts each family of a port's endpoints on its own,
// as kube-proxy's per-family proxiers do: a dual-stack port whose IPv4
// endpoint is here and whose IPv6 endpoint is elsewhere has no local IPv6
// endpoint only; a family without a servable endpoint is not counted.
func TestNoLocalPortsPerFamily(t *testing.T) {
	ep := func(addr, node string, ready bool) loadbalancer.Endpoint {
		return loadbalancer.Endpoint{Addr: netip.MustParseAddrPort(addr), NodeName: node, Ready: ready}
	}
	both := trafficPolicy{internalLocal: true, externalLocal: true}
	for _, tc := range []struct {
		name   string
		policy trafficPolicy
		eps    []loadbalancer.Endpoint
		want   noLocalPorts
	}{
		{"v4 here, v6 elsewhere", both, []loadbalancer.Endpoint{ep("10.1.0.1:80", "me", true), ep("[fd00::1]:80", "other", true)},
			noLocalPorts{{0, 0}, {1, 1}}},
		{"both elsewhere, external only", trafficPolicy{externalLocal: true}, []loadbalancer.Endpoint{ep("10.1.0.1:80", "other", true), ep("[fd00::1]:80", "other", true)},
			noLocalPorts{{0, 1}, {0, 1}}},
		{"v6 not servable", both, []loadbalancer.Endpoint{ep("10.1.0.1:80", "other", true), ep("[fd00::1]:80", "other", false)},
			noLocalPorts{{1, 1}, {0, 0}}},
		{"mapped v4 counts as v4", both, []loadbalancer.Endpoint{ep("[::ffff:10.1.0.1]:80", "other", true)},
			noLocalPorts{{1, 1}, {0, 0}}},
		{"cluster policies", trafficPolicy{}, []loadbalancer.Endpoint{ep("10.1.0.1:80", "other", true)},
			noLocalPorts{}},
	} {
		if got := (noLocalPorts{}).add(tc.policy, tc.eps, "me"); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
