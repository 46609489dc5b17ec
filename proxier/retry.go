package proxier

import (
	"slices"
	"time"

	"k8s.io/klog/v2"
)

// A sync that leaves work undone — a proxy socket that did not open (its
// port taken by another process, no free port in --proxy-port-range, the
// descriptor limit), a portal write iptables refused, or healthCheckNodePort
// servers the health server could not start — runs again on
// its own instead of waiting for the next Service change or the sync
// period: after min-sync-period (at least a second), doubling with each
// failing sync in a row up to the sync period. Something that fails anew
// (not left over from the last sync) starts the series again at the short
// wait, so a port that can never open does not slow the retry of a rule
// write that failed once. A sync that succeeds ends the series, and any
// sync that comes sooner retries the same work.

// retryFailures schedules the retry of a sync that left failed undone (one
// string per thing: "open NAME", "portals", ...).
func (p *Proxier) retryFailures(failed []string) {
	if len(failed) == 0 {
		p.failedSyncs, p.lastFailed = 0, nil
		return
	}
	slices.Sort(failed)
	for _, f := range failed {
		if _, left := slices.BinarySearch(p.lastFailed, f); !left {
			p.failedSyncs = 0 // a new failure
			break
		}
	}
	p.failedSyncs++
	p.lastFailed = failed
	d := retryBackoff(p.failedSyncs, p.opts.MinSyncPeriod, p.opts.SyncPeriod)
	klog.InfoS("Sync left work undone; retrying", "failures", len(failed), "after", d, "failedSyncsInARow", p.failedSyncs)
	p.runner.RetryAfter(d)
}

// retryBackoff is the wait before the retry after the n-th failing sync in a
// row (n ≥ 1).
func retryBackoff(n int, minInterval, maxInterval time.Duration) time.Duration {
	d := max(minInterval, time.Second)
	for i := 1; i < n && d < maxInterval; i++ {
		d *= 2
	}
	return max(min(d, maxInterval), time.Second)
}
