// Package healthcheck owns the proxier's health state and serves it as
// kube-proxy does: /healthz and /livez answer 503 once a queued change has
// waited longer than the health timeout (2 x --iptables-sync-period)
// without a sync. /healthz also answers 503 until the first sync succeeded,
// so a readiness probe does not pass a proxy that serves nothing yet.
package healthcheck

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// ProxierHealth tracks the last successful sync and the oldest change that
// still waits for one.
type ProxierHealth struct {
	clk     clock.PassiveClock
	timeout time.Duration

	mu            sync.Mutex
	lastUpdated   time.Time
	oldestPending time.Time
	nodeDeleted   bool
	// families are the IP families the proxy serves ("IPv4", "IPv6"),
	// each a key of the body's status once the first sync is in.
	families []string
}

// SetFamilies names the IP families the proxy programs, for the body's
// per-family status (kube-proxy has a proxier per family; here one sync
// covers them all, so they share its time and health).
func (h *ProxierHealth) SetFamilies(families ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.families = append([]string(nil), families...)
}

// NewProxierHealth starts live (a proxy that has not yet synced has not yet
// failed to, so /livez is 200) but not ready: /healthz is 503 until the
// first Updated.
func NewProxierHealth(clk clock.PassiveClock, timeout time.Duration) *ProxierHealth {
	return &ProxierHealth{clk: clk, timeout: timeout}
}

// QueuedUpdate records that a change waits for a sync.
func (h *ProxierHealth) QueuedUpdate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.oldestPending.IsZero() {
		h.oldestPending = h.clk.Now()
	}
}

// Updated records a successful sync.
func (h *ProxierHealth) Updated() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = h.clk.Now()
	h.oldestPending = time.Time{}
}

// SetNodeDeleted marks the node as being deleted; /healthz then fails (so
// load balancers drain the node) while /livez stays up.
func (h *ProxierHealth) SetNodeDeleted(deleted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeDeleted = deleted
}

// Status is the JSON body of /healthz and /livez, kube-proxy's
// ProxyHealth: lastUpdated is the last successful sync while unhealthy and
// the current time while healthy (kube-proxy keeps the older releases'
// meaning, "recent when healthy", so probes comparing it with currentTime
// keep working); healthy is the proxy's own health, which on /healthz also
// needs the first sync, while the status code also needs nodeEligible (a
// node being deleted answers 503 with healthy true, as kube-proxy's);
// status is per IP family, once the first sync is in.
type Status struct {
	LastUpdated  time.Time               `json:"lastUpdated"`
	CurrentTime  time.Time               `json:"currentTime"`
	NodeEligible *bool                   `json:"nodeEligible,omitempty"`
	Healthy      bool                    `json:"healthy"`
	Status       map[string]FamilyStatus `json:"status,omitempty"`
}

// FamilyStatus is one IP family's entry of Status, kube-proxy's
// ProxierHealth.
type FamilyStatus struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Healthy reports whether no queued change has waited past the timeout.
func (h *ProxierHealth) Healthy() (bool, Status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clk.Now()
	healthy := h.oldestPending.IsZero() || now.Sub(h.oldestPending) < h.timeout
	st := Status{LastUpdated: h.lastUpdated, CurrentTime: now}
	if !h.lastUpdated.IsZero() && len(h.families) > 0 {
		st.Status = make(map[string]FamilyStatus, len(h.families))
		for _, f := range h.families {
			st.Status[f] = FamilyStatus{LastUpdated: h.lastUpdated, Healthy: healthy}
		}
	}
	return healthy, st
}

// Handler serves /healthz (which also fails while the node is being
// deleted) or /livez (proxy health only).
func (h *ProxierHealth) Handler(livez bool, count func(code int)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		healthy, st := h.Healthy()
		ok := healthy
		if !livez {
			h.mu.Lock()
			eligible := !h.nodeDeleted
			h.mu.Unlock()
			st.NodeEligible = &eligible
			// Readiness: nothing is served before the first sync.
			healthy = healthy && !st.LastUpdated.IsZero()
			ok = healthy && eligible
		}
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		} else {
			st.LastUpdated = st.CurrentTime
		}
		st.Healthy = healthy
		if count != nil {
			count(code)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		body, _ := json.Marshal(st)
		fmt.Fprintln(w, string(body))
	})
}
