package main

import (
	"sync/atomic"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// healthWhileWaiting is the proxier's health updater in a proxy that may
// wait for another one programming this network namespace's rules
// (instanceClaim.NoProxyHolds). A change queued while it waits is not its
// to sync yet: counted, it aged into a failed /livez after the health
// timeout, and a liveness probe on the waiting proxy's own port restarted
// it over and over, though waiting is what it should do (its /healthz
// stays 503 meanwhile: it has never synced). Once the wait is over, the
// changes it held back are queued at once (takeOver), so they count from
// the moment this proxy owes their sync.
type healthWhileWaiting struct {
	inner proxier.HealthUpdater
	// waitOver is closed once no other proxy holds the rules.
	waitOver <-chan struct{}
	// heldBack: a change came while waiting.
	heldBack atomic.Bool
}

func (h *healthWhileWaiting) QueuedUpdate() {
	select {
	case <-h.waitOver:
		h.inner.QueuedUpdate()
	default:
		h.heldBack.Store(true)
	}
}

func (h *healthWhileWaiting) Updated(families ...string) { h.inner.Updated(families...) }

// takeOver queues the changes held back while waiting; run calls it once
// the wait is over, before the proxier runs.
func (h *healthWhileWaiting) takeOver() {
	if h.heldBack.Swap(false) {
		h.inner.QueuedUpdate()
	}
}
