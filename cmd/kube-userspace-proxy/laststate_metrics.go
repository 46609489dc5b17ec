package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// registerLastKnownStateMetrics exports --state-file's status: whether the
// proxy serves the file's Services (an operator alerts on a node that does
// for long: its view is as old as the file), when the file was last
// written, and failed writes (a start during an outage would serve an
// older file, or none).
func registerLastKnownStateMetrics(reg prometheus.Registerer, s *config.LastKnownState) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubeproxy_userspace_last_known_state_serving",
			Help: "1 while the Services and EndpointSlices served are --state-file's (the API server has not answered since the start), else 0.",
		}, func() float64 {
			if s.Status().Serving {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubeproxy_userspace_last_known_state_written_timestamp_seconds",
			Help: "When --state-file was last written (Unix seconds; 0: not yet).",
		}, func() float64 {
			if w := s.Status().Written; !w.IsZero() {
				return float64(w.UnixNano()) / 1e9
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kubeproxy_userspace_last_known_state_write_errors_total",
			Help: "Writes of --state-file that failed.",
		}, func() float64 { return float64(s.Status().WriteErrors) }),
	)
}
