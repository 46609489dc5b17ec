package main

import (
	"context"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// restClientMetrics are client-go's request metrics under kube-proxy's
// names (component-base's rest_client_requests_total and
// rest_client_request_duration_seconds), on the proxy's registry: without
// them /metrics said nothing of the API client's health (refusals,
// timeouts, latency).
type restClientMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func (m restClientMetrics) Increment(_ context.Context, code, method, host string) {
	m.requests.WithLabelValues(code, method, host).Inc()
}

// restClientLatency is the LatencyMetric side (its Observe differs from
// the histogram's).
type restClientLatency struct{ h *prometheus.HistogramVec }

func (l restClientLatency) Observe(_ context.Context, verb string, u url.URL, d time.Duration) {
	l.h.WithLabelValues(verb, u.Host).Observe(d.Seconds())
}

var (
	restClientMetricsOnce sync.Once
	restClient            restClientMetrics
)

// registerRESTClientMetrics puts client-go's request metrics on reg.
// client-go takes one set of hooks per process: they are made and handed
// to it once, and every registry given gets those same collectors (a
// registry given only after another was first had none).
func registerRESTClientMetrics(reg prometheus.Registerer) {
	restClientMetricsOnce.Do(func() {
		restClient = restClientMetrics{
			requests: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "rest_client_requests_total",
				Help: "Number of HTTP requests, partitioned by status code, method, and host.",
			}, []string{"code", "method", "host"}),
			latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Name:    "rest_client_request_duration_seconds",
				Help:    "Request latency in seconds. Broken down by verb, and host.",
				Buckets: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0},
			}, []string{"verb", "host"}),
		}
		clientmetrics.Register(clientmetrics.RegisterOpts{RequestResult: restClient, RequestLatency: restClientLatency{restClient.latency}})
	})
	reg.MustRegister(restClient.requests, restClient.latency)
}
