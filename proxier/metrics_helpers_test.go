package proxier

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

type dtoHistogram struct {
	count uint64
	sum   float64
}

func (h *dtoHistogram) read(t *testing.T, p *Proxier) {
	t.Helper()
	var m dto.Metric
	if err := p.metrics.NetworkProgrammingLatency.WithLabelValues("IPv4").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	h.count, h.sum = m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// lookup returns the series of a port.
func (s *portSeries) lookup(label string) *portMetrics {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ports[label]
}
