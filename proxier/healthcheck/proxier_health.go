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

// ProxierHealth tracks, per IP family served, the last successful sync
// and the oldest change that still waits for one, as kube-proxy's
// ProxyHealthServer tracks each of its per-family proxiers.
type ProxierHealth struct {
	clk     clock.PassiveClock
	timeout time.Duration

	mu sync.Mutex
	// lastUpdated and oldestPending are by family (families; "" while
	// none is named).
	lastUpdated   map[string]time.Time
	oldestPending map[string]time.Time
	nodeDeleted   bool
	// families are the IP families the proxy serves ("IPv4", "IPv6"),
	// each a key of the body's status once the first sync is in.
	families []string
}

// SetFamilies names the IP families the proxy programs, for the body's
// per-family status (kube-proxy has a proxier per family; here one sync
// covers them all, and says which of them it wrote: Updated). Call it
// before the first QueuedUpdate.
func (h *ProxierHealth) SetFamilies(families ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.families = append([]string(nil), families...)
}

// NewProxierHealth starts live (a proxy that has not yet synced has not yet
// failed to, so /livez is 200) but not ready: /healthz is 503 until the
// first Updated.
func NewProxierHealth(clk clock.PassiveClock, timeout time.Duration) *ProxierHealth {
	return &ProxierHealth{clk: clk, timeout: timeout, lastUpdated: map[string]time.Time{}, oldestPending: map[string]time.Time{}}
}

// keys are the families tracked: those named, else one for all. mu is
// held.
func (h *ProxierHealth) keys() []string {
	if len(h.families) == 0 {
		return []string{""}
	}
	return h.families
}

// QueuedUpdate records that a change waits for a sync of every family.
func (h *ProxierHealth) QueuedUpdate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clk.Now()
	for _, f := range h.keys() {
		if h.oldestPending[f].IsZero() {
			h.oldestPending[f] = now
		}
	}
}

// Updated records a sync that wrote the rules of families (none named:
// every family), as kube-proxy's proxier of each family reports its own:
// one family whose rules failed (ip6tables-restore refused) no longer
// holds back the other's last sync time and health.
func (h *ProxierHealth) Updated(families ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(families) == 0 || len(h.families) == 0 {
		families = h.keys()
	}
	now := h.clk.Now()
	for _, f := range families {
		h.lastUpdated[f] = now
		delete(h.oldestPending, f)
	}
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
	// synced: every family has had a successful sync (readiness).
	synced bool
}

// FamilyStatus is one IP family's entry of Status, kube-proxy's
// ProxierHealth.
type FamilyStatus struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Healthy reports whether no queued change has waited past the timeout
// in any family. Its status's lastUpdated is the latest family's, as
// kube-proxy's; the per-family status is there once a family has synced.
func (h *ProxierHealth) Healthy() (bool, Status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clk.Now()
	st := Status{CurrentTime: now, synced: true}
	healthy := true
	familyHealthy := make(map[string]bool, len(h.keys()))
	for _, f := range h.keys() {
		pending := h.oldestPending[f]
		familyHealthy[f] = pending.IsZero() || now.Sub(pending) < h.timeout
		healthy = healthy && familyHealthy[f]
		last := h.lastUpdated[f]
		if last.After(st.LastUpdated) {
			st.LastUpdated = last
		}
		st.synced = st.synced && !last.IsZero()
	}
	if !st.LastUpdated.IsZero() && len(h.families) > 0 {
		st.Status = make(map[string]FamilyStatus, len(h.families))
		for _, f := range h.families {
			st.Status[f] = FamilyStatus{LastUpdated: h.lastUpdated[f], Healthy: familyHealthy[f]}
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
			// Readiness: nothing is served before the first sync (of
			// every family: one whose rules were never written serves
			// none of its Services).
			healthy = healthy && st.synced
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
