package faults

import "github.com/prometheus/client_golang/prometheus"

// Metrics count what faults did, in Envoy's spirit (faults injected per
// kind, faulted connections live).
type Metrics struct {
	Injected *prometheus.CounterVec
	Faulted  *prometheus.GaugeVec
	Skipped  *prometheus.CounterVec
}

// NewMetrics registers on reg (nil: unregistered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Injected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "userspace", Name: "faults_injected_total",
			Help: "Toxics applied: per connection (TCP) or per datagram (UDP)",
		}, []string{"service_port", "toxic", "type", "stream"}),
		Faulted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "userspace", Name: "faulted_connections",
			Help: "Live TCP connections with at least one toxic applied",
		}, []string{"service_port"}),
		Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "userspace", Name: "faults_skipped_max_active_total",
			Help: "Connections left unfaulted because --fault-max-active faulted connections were live",
		}, []string{"service_port"}),
	}
	if reg != nil {
		reg.MustRegister(m.Injected, m.Faulted, m.Skipped)
	}
	return m
}

func (m *Metrics) forget(label string) {
	m.Injected.DeletePartialMatch(prometheus.Labels{"service_port": label})
	m.Faulted.DeleteLabelValues(label)
	m.Skipped.DeleteLabelValues(label)
}
