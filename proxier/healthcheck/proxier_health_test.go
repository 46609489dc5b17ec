package healthcheck

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// healthBody is the body as a client reads it (healthy absent = nil).
type healthBody struct {
	LastUpdated  time.Time               `json:"lastUpdated"`
	CurrentTime  time.Time               `json:"currentTime"`
	NodeEligible *bool                   `json:"nodeEligible"`
	Healthy      *bool                   `json:"healthy"`
	Status       map[string]FamilyStatus `json:"status"`
}

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
			h.SetFamilies("IPv4", "IPv6")
			tt.steps(h, clk)
			counted := 0
			rec := httptest.NewRecorder()
			h.Handler(tt.livez, func(c int) { counted = c }).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			if rec.Code != tt.wantCode || counted != tt.wantCounted {
				t.Fatalf("code %d counted %d, want %d", rec.Code, counted, tt.wantCode)
			}
			var st healthBody
			if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
				t.Fatalf("body %q: %v", rec.Body.String(), err)
			}
			if !st.CurrentTime.Equal(clk.Now()) {
				t.Errorf("currentTime %v, want %v", st.CurrentTime, clk.Now())
			}
			// kube-proxy's body: healthy is the proxy's own health (the
			// code also needs nodeEligible: a node being deleted answers
			// 503 with healthy true), lastUpdated the current time while
			// the code is 200, else the last sync (none before the first).
			wantHealthy := tt.wantCode == http.StatusOK || (st.NodeEligible != nil && !*st.NodeEligible)
			if st.Healthy == nil || *st.Healthy != wantHealthy {
				t.Errorf("healthy %v with code %d: %s", st.Healthy, rec.Code, rec.Body.String())
			}
			// One status per family once a sync is in, as kube-proxy's
			// proxiers per family.
			proxyHealthy, raw := h.Healthy()
			if synced := !raw.LastUpdated.IsZero(); synced != (st.Status != nil) {
				t.Errorf("status %v after a sync %v", st.Status, synced)
			}
			for _, f := range []string{"IPv4", "IPv6"} {
				if fs, ok := st.Status[f]; st.Status != nil && (!ok || fs.Healthy != proxyHealthy || !fs.LastUpdated.Equal(raw.LastUpdated)) {
					t.Errorf("status[%s] = %+v, %v: %s", f, fs, ok, rec.Body.String())
				}
			}
			if tt.wantCode == http.StatusOK && !st.LastUpdated.Equal(clk.Now()) {
				t.Errorf("healthy: lastUpdated %v, want the current time %v", st.LastUpdated, clk.Now())
			}
			if (st.NodeEligible == nil) != tt.livez {
				t.Errorf("nodeEligible presence wrong for livez=%v: %s", tt.livez, rec.Body.String())
			}
		})
	}
}

// While unhealthy the body's lastUpdated is the last successful sync, as
// kube-proxy's, so the age of the lag can be read from it.
func TestProxierHealthUnhealthyKeepsLastSync(t *testing.T) {
	const timeout = 60 * time.Second
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	h := NewProxierHealth(clk, timeout)
	h.Updated()
	synced := clk.Now()
	clk.Step(time.Second)
	h.QueuedUpdate()
	clk.Step(timeout)
	rec := httptest.NewRecorder()
	h.Handler(false, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var st healthBody
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	if rec.Code != http.StatusServiceUnavailable || st.Healthy == nil || *st.Healthy || !st.LastUpdated.Equal(synced) {
		t.Fatalf("code %d body %s; want 503, healthy false, lastUpdated %v", rec.Code, rec.Body.String(), synced)
	}
}

// Each family's sync is its own, as each of kube-proxy's per-family
// proxiers reports its own: a family whose rules were written is healthy
// with its own last sync while the other's change waits; the proxy is
// unhealthy once that wait passes the timeout, and /healthz stays 503
// until every family has synced once.
func TestProxierHealthPerFamily(t *testing.T) {
	const timeout = 60 * time.Second
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	h := NewProxierHealth(clk, timeout)
	h.SetFamilies("IPv4", "IPv6")
	get := func(livez bool) (int, healthBody) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.Handler(livez, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		var st healthBody
		if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
			t.Fatalf("body %q: %v", rec.Body.String(), err)
		}
		return rec.Code, st
	}
	h.QueuedUpdate()
	h.Updated("IPv4")
	v4synced := clk.Now()
	if code, st := get(false); code != http.StatusServiceUnavailable || !st.Status["IPv4"].LastUpdated.Equal(v4synced) || !st.Status["IPv6"].LastUpdated.IsZero() {
		t.Errorf("IPv4 synced only: healthz %d %+v, want 503 (IPv6 never synced), IPv4 at %v", code, st, v4synced)
	}
	if code, _ := get(true); code != http.StatusOK {
		t.Errorf("IPv4 synced only, IPv6 within the timeout: livez %d, want 200", code)
	}
	clk.Step(timeout)
	code, st := get(true)
	if code != http.StatusServiceUnavailable || !st.Status["IPv4"].Healthy || st.Status["IPv6"].Healthy {
		t.Errorf("IPv6 late: livez %d %+v, want 503, IPv4 healthy, IPv6 not", code, st)
	}
	if !st.LastUpdated.Equal(v4synced) {
		t.Errorf("lastUpdated %v, want IPv4's %v (the latest family's, as kube-proxy)", st.LastUpdated, v4synced)
	}
	h.Updated("IPv6")
	if code, st := get(false); code != http.StatusOK || !st.Status["IPv6"].Healthy || !st.Status["IPv4"].LastUpdated.Equal(v4synced) {
		t.Errorf("both synced: healthz %d %+v, want 200, IPv4 still at %v", code, st, v4synced)
	}
}
