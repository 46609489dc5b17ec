package proxier

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// affinityCollector reports each service port's ClientIP affinity table at
// scrape time, from the balancer that owns the tables: the size, and how
// many clients the --affinity-max-entries-per-port cap evicted. Reading at
// scrape time keeps the data path free of metric updates, and a removed
// service port's series go with it.
type affinityCollector struct {
	lb      atomic.Pointer[loadbalancer.LoadBalancer]
	entries *prometheus.Desc
	evicted *prometheus.Desc
}

func newAffinityCollector() *affinityCollector {
	return &affinityCollector{
		entries: prometheus.NewDesc("kubeproxy_userspace_affinity_entries",
			"ClientIP affinity entries held per service port", []string{"service_port"}, nil),
		evicted: prometheus.NewDesc("kubeproxy_userspace_affinity_entries_evicted_total",
			"ClientIP affinity entries evicted (least recently used first) because the table was at --affinity-max-entries-per-port",
			[]string{"service_port"}, nil),
	}
}

// observe makes lb the balancer reported; the latest proxier built on these
// Metrics wins.
func (c *affinityCollector) observe(lb *loadbalancer.LoadBalancer) { c.lb.Store(lb) }

func (c *affinityCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.entries
	ch <- c.evicted
}

func (c *affinityCollector) Collect(ch chan<- prometheus.Metric) {
	lb := c.lb.Load()
	if lb == nil {
		return
	}
	for name, st := range lb.AffinityStats() {
		label := name.String()
		ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(st.Entries), label)
		ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(st.Evicted), label)
	}
}
