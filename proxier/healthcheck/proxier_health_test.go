package healthcheck

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestProxierHealth(t *testing.T) {
	const timeout = 60 * time.Second
	tests := []struct {
		name        string
		steps       func(h *ProxierHealth, clk *clocktesting.FakeClock)
		livez       bool
		wantCode    int
		wantCounted int
	}{
		{"healthz 503 before the first sync", func(*ProxierHealth, *clocktesting.FakeClock) {}, false, 503, 503},
		{"livez 200 before the first sync", func(*ProxierHealth, *clocktesting.FakeClock) {}, true, 200, 200},
		{"healthz 200 after the first sync", func(h *ProxierHealth, _ *clocktesting.FakeClock) { h.Updated() }, false, 200, 200},
		{"queued change within timeout", func(h *ProxierHealth, clk *clocktesting.FakeClock) {
			h.Updated()
			h.QueuedUpdate()
			clk.Step(timeout - time.Second)
		}, false, 200, 200},
		{"queued change past timeout", func(h *ProxierHealth, clk *clocktesting.FakeClock) {
			h.QueuedUpdate()
			clk.Step(timeout)
		}, false, 503, 503},
		{"oldest change counts, not newest", func(h *ProxierHealth, clk *clocktesting.FakeClock) {
			h.QueuedUpdate()
			clk.Step(timeout / 2)
			h.QueuedUpdate()
			clk.Step(timeout / 2)
		}, true, 503, 503},
		{"sync clears pending", func(h *ProxierHealth, clk *clocktesting.FakeClock) {
			h.QueuedUpdate()
			clk.Step(timeout)
			h.Updated()
			clk.Step(timeout)
		}, false, 200, 200},
		{"node deleted fails healthz", func(h *ProxierHealth, _ *clocktesting.FakeClock) { h.Updated(); h.SetNodeDeleted(true) }, false, 503, 503},
		{"node deleted keeps livez", func(h *ProxierHealth, _ *clocktesting.FakeClock) { h.Updated(); h.SetNodeDeleted(true) }, true, 200, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			h := NewProxierHealth(clk, timeout)
			tt.steps(h, clk)
			counted := 0
			rec := httptest.NewRecorder()
			h.Handler(tt.livez, func(c int) { counted = c }).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			if rec.Code != tt.wantCode || counted != tt.wantCounted {
				t.Fatalf("code %d counted %d, want %d", rec.Code, counted, tt.wantCode)
			}
			var st Status
			if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
				t.Fatalf("body %q: %v", rec.Body.String(), err)
			}
			if !st.CurrentTime.Equal(clk.Now()) {
				t.Errorf("currentTime %v, want %v", st.CurrentTime, clk.Now())
			}
			if (st.NodeEligible == nil) != tt.livez {
				t.Errorf("nodeEligible presence wrong for livez=%v: %s", tt.livez, rec.Body.String())
			}
		})
	}
}
