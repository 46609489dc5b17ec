package proxier

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// portalStats is what a PortalSyncer may tell about the rules it wrote
// (iptables.Rules does).
type portalStats interface {
	RuleCounts() (filter, nat int)
	LastSyncRuleCounts() (filter, nat int)
	PartialRestoreFailures() uint64
}

// portalCollector reports kube-proxy's iptables series at scrape time from
// the syncer of each family, under its ip_family as kube-proxy's
// per-family proxiers export them: sync_proxy_rules_iptables_total{table,
// ip_family}, sync_proxy_rules_iptables_last{table, ip_family} (the rules
// the last sync wrote: a partial one writes only the changed rules) and
// sync_proxy_rules_iptables_partial_restore_failures_total{ip_family}.
// Nothing when the proxy writes no rules (--iptables=false).
type portalCollector struct {
	syncers atomic.Pointer[[]familyStats]
	rules   *prometheus.Desc
	last    *prometheus.Desc
	partial *prometheus.Desc
}

// familyStats is one family's syncer that can tell its rule counts.
type familyStats struct {
	family string
	stats  portalStats
}

func newPortalCollector() *portalCollector {
	return &portalCollector{
		rules: prometheus.NewDesc("kubeproxy_sync_proxy_rules_iptables_total",
			"Total number of iptables rules owned by kube-proxy", []string{"table", "ip_family"}, nil),
		last: prometheus.NewDesc("kubeproxy_sync_proxy_rules_iptables_last",
			"Number of iptables rules written by kube-proxy in last sync", []string{"table", "ip_family"}, nil),
		partial: prometheus.NewDesc("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
			"Cumulative proxy iptables partial restore failures", []string{"ip_family"}, nil),
	}
}

// observe makes the IPv4 and IPv6 syncers the ones reported (those that
// can tell); the latest proxier built on these Metrics wins.
func (c *portalCollector) observe(v4, v6 PortalSyncer) {
	var stats []familyStats
	for _, s := range []struct {
		family string
		syncer PortalSyncer
	}{{ipv4Family, v4}, {ipv6Family, v6}} {
		if st, ok := s.syncer.(portalStats); ok {
			stats = append(stats, familyStats{s.family, st})
		}
	}
	c.syncers.Store(&stats)
}

func (c *portalCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rules
	ch <- c.last
	ch <- c.partial
}

func (c *portalCollector) Collect(ch chan<- prometheus.Metric) {
	stats := c.syncers.Load()
	if stats == nil {
		return
	}
	for _, s := range *stats {
		filter, nat := s.stats.RuleCounts()
		ch <- prometheus.MustNewConstMetric(c.rules, prometheus.GaugeValue, float64(filter), "filter", s.family)
		ch <- prometheus.MustNewConstMetric(c.rules, prometheus.GaugeValue, float64(nat), "nat", s.family)
		filter, nat = s.stats.LastSyncRuleCounts()
		ch <- prometheus.MustNewConstMetric(c.last, prometheus.GaugeValue, float64(filter), "filter", s.family)
		ch <- prometheus.MustNewConstMetric(c.last, prometheus.GaugeValue, float64(nat), "nat", s.family)
		ch <- prometheus.MustNewConstMetric(c.partial, prometheus.CounterValue, float64(s.stats.PartialRestoreFailures()), s.family)
	}
}
