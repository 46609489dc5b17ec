package proxier

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
)

type dtoHistogram struct {
	count uint64
	sum   float64
}

func (h *dtoHistogram) read(t *testing.T, p *Proxier) {
	t.Helper()
	var m dto.Metric
	if err := p.metrics.NetworkProgrammingLatency.Write(&m); err != nil {
		t.Fatal(err)
	}
	h.count, h.sum = m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}
