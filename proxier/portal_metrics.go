package proxier

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// portalStats is what a PortalSyncer may tell about the rules it wrote
// (iptables.Rules does).
type portalStats interface {
	RuleCounts() (filter, nat int)
	PartialRestoreFailures() uint64
}

// portalCollector reports kube-proxy's iptables series at scrape time from
// the syncers of both families, summed as kube-proxy's dual-stack proxiers
// share them: sync_proxy_rules_iptables_total{table} and
// sync_proxy_rules_iptables_partial_restore_failures_total. Nothing when
// the proxy writes no rules (--iptables=false).
type portalCollector struct {
	syncers atomic.Pointer[[]portalStats]
	rules   *prometheus.Desc
	partial *prometheus.Desc
}

func newPortalCollector() *portalCollector {
	return &portalCollector{
		rules: prometheus.NewDesc("kubeproxy_sync_proxy_rules_iptables_total",
			"Total number of iptables rules owned by kube-proxy", []string{"table"}, nil),
		partial: prometheus.NewDesc("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
			"Cumulative proxy iptables partial restore failures", nil, nil),
	}
}

// observe makes the given syncers the ones reported (those that can tell);
// the latest proxier built on these Metrics wins.
func (c *portalCollector) observe(syncers ...PortalSyncer) {
	var stats []portalStats
	for _, s := range syncers {
		if st, ok := s.(portalStats); ok {
			stats = append(stats, st)
		}
	}
	c.syncers.Store(&stats)
}

func (c *portalCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rules
	ch <- c.partial
}

func (c *portalCollector) Collect(ch chan<- prometheus.Metric) {
	stats := c.syncers.Load()
	if stats == nil || len(*stats) == 0 {
		return
	}
	var filter, nat int
	var partial uint64
	for _, s := range *stats {
		f, n := s.RuleCounts()
		filter, nat = filter+f, nat+n
		partial += s.PartialRestoreFailures()
	}
	ch <- prometheus.MustNewConstMetric(c.rules, prometheus.GaugeValue, float64(filter), "filter")
	ch <- prometheus.MustNewConstMetric(c.rules, prometheus.GaugeValue, float64(nat), "nat")
	ch <- prometheus.MustNewConstMetric(c.partial, prometheus.CounterValue, float64(partial))
}
