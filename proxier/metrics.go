package proxier

import (
	"slices"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are kube-proxy's sync metrics, under kube-proxy's names so existing
// dashboards work, plus the data-path metrics only a userspace proxy has.
type Metrics struct {
	Registry *prometheus.Registry

	// The sync series carry kube-proxy's ip_family label (IPv4, IPv6), as
	// each of kube-proxy's per-family proxiers exports its own: one sync
	// here covers every family served, so it is recorded under each
	// (SetFamilies), as a dual-stack kube-proxy's two proxiers record
	// theirs.
	SyncProxyRulesLatency        *prometheus.HistogramVec
	SyncFullProxyRulesLatency    *prometheus.HistogramVec
	SyncPartialProxyRulesLatency *prometheus.HistogramVec
	SyncProxyRulesLastTimestamp  *prometheus.GaugeVec
	SyncProxyRulesLastQueued     *prometheus.GaugeVec
	// NetworkProgrammingLatency is recorded under the family of the
	// EndpointSlice whose trigger time it measures.
	NetworkProgrammingLatency *prometheus.HistogramVec
	EndpointChangesTotal      prometheus.Counter
	EndpointChangesPending    prometheus.Gauge
	ServiceChangesTotal       prometheus.Counter
	ServiceChangesPending     prometheus.Gauge
	// IPTablesRestoreFailures is counted under the family whose write failed.
	IPTablesRestoreFailures *prometheus.CounterVec
	// NoLocalEndpoints counts the service ports with a Local traffic
	// policy whose endpoints are all on other nodes, by traffic_policy
	// (internal, external) and ip_family (the endpoints' family, as each
	// of kube-proxy's per-family proxiers counts): their traffic is
	// refused here.
	NoLocalEndpoints  *prometheus.GaugeVec
	ProxyHealthzTotal *prometheus.CounterVec
	ProxyLivezTotal   *prometheus.CounterVec

	ServicePorts prometheus.Gauge
	// ServicePortsUnserved counts the wanted proxy sockets the last sync
	// could not open (retried; /debug/services names each): the sync
	// timestamp and /healthz follow the rules, which such a port does not
	// stop, so an alert on them never saw a port that could not open.
	ServicePortsUnserved prometheus.Gauge
	AffinitySwept        prometheus.Counter

	// ports are the per-service-port data-path series
	// (kubeproxy_userspace_active_connections and the rest, port_metrics.go).
	ports    *portSeries
	affinity *affinityCollector // table sizes and cap evictions, read from the balancer
	portals  *portalCollector   // rule counts and partial restore failures, read from the syncers

	families atomic.Pointer[[]string] // the ip_family values of the sync series (SetFamilies)
}

// NewMetrics registers everything on a fresh registry (not the global one, so
// tests can build many proxiers).
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry:              prometheus.NewRegistry(),
		SyncProxyRulesLatency: syncDuration("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds"),
		SyncFullProxyRulesLatency: syncDuration("sync_full_proxy_rules_duration_seconds",
			"SyncProxyRules latency in seconds for full resyncs (portal rules read back and repaired)"),
		SyncPartialProxyRulesLatency: syncDuration("sync_partial_proxy_rules_duration_seconds",
			"SyncProxyRules latency in seconds for partial resyncs (only changed portal rules written)"),
		SyncProxyRulesLastTimestamp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced",
		}, []string{"ip_family"}),
		SyncProxyRulesLastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a sync of proxy rules was queued",
		}, []string{"ip_family"}),
		NetworkProgrammingLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "kubeproxy", Name: "network_programming_duration_seconds",
			Help:    "In Cluster Network Programming Latency in seconds (trigger time of an endpoint change to its being served: the balancer having it when its ports have their proxy sockets, else the sync that opens them and writes their rules)",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}, []string{"ip_family"}),
		EndpointChangesTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes",
		}),
		EndpointChangesPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_endpoint_changes_pending",
			Help: "Pending proxy rules Endpoint changes (always 0 here: endpoint changes apply at once)",
		}),
		ServiceChangesTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes",
		}),
		ServiceChangesPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_service_changes_pending",
			Help: "Pending proxy rules Service changes",
		}),
		IPTablesRestoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_iptables_restore_failures_total",
			Help: "Cumulative proxy iptables restore failures",
		}, []string{"ip_family"}),
		NoLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: "kubeproxy", Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints",
		}, []string{"traffic_policy", "ip_family"}),
		ProxyHealthzTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "proxy_healthz_total",
			Help: "Cumulative proxy healthz HTTP status",
		}, []string{"code"}),
		ProxyLivezTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "proxy_livez_total",
			Help: "Cumulative proxy livez HTTP status",
		}, []string{"code"}),
		ServicePorts: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "userspace", Name: "service_ports",
			Help: "Service ports with an open proxy socket",
		}),
		ServicePortsUnserved: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "userspace", Name: "service_ports_unserved",
			Help: "Proxy sockets of service ports that the last sync could not open (retried)",
		}),
		AffinitySwept: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "userspace", Name: "affinity_entries_swept_total",
			Help: "Expired ClientIP affinity entries removed by the periodic sweep",
		}),
	}
	m.SetFamilies(ipv4Family, ipv6Family)
	m.ports = newPortSeries()
	m.affinity = newAffinityCollector()
	m.portals = newPortalCollector()
	m.Registry.MustRegister(
		m.affinity, m.portals,
		m.SyncProxyRulesLatency, m.SyncFullProxyRulesLatency, m.SyncPartialProxyRulesLatency,
		m.SyncProxyRulesLastTimestamp, m.SyncProxyRulesLastQueued, m.NetworkProgrammingLatency,
		m.EndpointChangesTotal, m.EndpointChangesPending,
		m.ServiceChangesTotal, m.ServiceChangesPending, m.IPTablesRestoreFailures, m.NoLocalEndpoints,
		m.ProxyHealthzTotal, m.ProxyLivezTotal,
		m.ports, m.ServicePorts, m.ServicePortsUnserved, m.AffinitySwept,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// syncDuration is one of kube-proxy's sync duration histograms, with its
// buckets (1 ms to 16 s) and its ip_family label.
func syncDuration(name, help string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: "kubeproxy", Name: name, Help: help,
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	}, []string{"ip_family"})
}

// SetFamilies names the IP families the proxy serves ("IPv4", "IPv6"; both
// until told): the ip_family series of the sync metrics, exported from the
// start at 0 as kube-proxy's proxiers of those families export theirs. Call
// it before the first sync.
func (m *Metrics) SetFamilies(families ...string) {
	fams := append([]string(nil), families...)
	m.families.Store(&fams)
	for _, v := range []interface{ Reset() }{
		m.SyncProxyRulesLatency, m.SyncFullProxyRulesLatency, m.SyncPartialProxyRulesLatency,
		m.SyncProxyRulesLastTimestamp, m.SyncProxyRulesLastQueued, m.NetworkProgrammingLatency,
		m.IPTablesRestoreFailures, m.NoLocalEndpoints,
	} {
		v.Reset()
	}
	for _, f := range fams {
		m.SyncProxyRulesLatency.WithLabelValues(f)
		m.SyncFullProxyRulesLatency.WithLabelValues(f)
		m.SyncPartialProxyRulesLatency.WithLabelValues(f)
		m.SyncProxyRulesLastTimestamp.WithLabelValues(f)
		m.SyncProxyRulesLastQueued.WithLabelValues(f)
		m.NetworkProgrammingLatency.WithLabelValues(f)
		m.IPTablesRestoreFailures.WithLabelValues(f)
		// kube-proxy exports both policies from the start, at 0.
		m.NoLocalEndpoints.WithLabelValues("internal", f)
		m.NoLocalEndpoints.WithLabelValues("external", f)
	}
}

// servedFamilies is SetFamilies' list.
func (m *Metrics) servedFamilies() []string { return *m.families.Load() }

// observeSync records one sync, which covered every family served, under
// each of them; its last-sync time only under the families whose rules it
// wrote (not in failed), as kube-proxy's proxier of each family sets its
// own.
func (m *Metrics) observeSync(seconds float64, full bool, failed []string) {
	for _, f := range m.servedFamilies() {
		m.SyncProxyRulesLatency.WithLabelValues(f).Observe(seconds)
		if full {
			m.SyncFullProxyRulesLatency.WithLabelValues(f).Observe(seconds)
		} else {
			m.SyncPartialProxyRulesLatency.WithLabelValues(f).Observe(seconds)
		}
		if !slices.Contains(failed, f) {
			m.SyncProxyRulesLastTimestamp.WithLabelValues(f).SetToCurrentTime()
		}
	}
}

// syncQueued records that a change queued a sync of every family.
func (m *Metrics) syncQueued() {
	for _, f := range m.servedFamilies() {
		m.SyncProxyRulesLastQueued.WithLabelValues(f).SetToCurrentTime()
	}
}

// forgetServicePort drops a removed service port's series so /metrics does
// not grow with every Service ever seen.
func (m *Metrics) forgetServicePort(label string) { m.ports.forget(label) }
