package proxier

import (
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
)

// A sync that leaves work undone — a proxy socket that did not open (its
// port taken by another process, no free port in --proxy-port-range, the
// descriptor limit), a portal write iptables refused, or healthCheckNodePort
// servers the health server could not start — runs again on
// its own instead of waiting for the next Service change or the sync
// period: after min-sync-period (at least a second) plus the time the same
// work has been failing, up to the sync period. Retries alone so come
// after 1 s, 2 s, 4 s, ...; the wait grows with time, not with the number
// of syncs, so Service changes that sync in between (each one retrying
// the same work) do not stretch it: counting syncs, a few manifest edits
// pushed the retry of a port that had just come free out to the sync
// period. Something that fails anew (not left over from the last sync)
// starts the series again at the short wait, so a port that can never
// open does not slow the retry of a rule write that failed once. A sync
// that succeeds ends the series.

// retryFailures schedules the retry of a sync that left failed undone (one
// string per thing: "open NAME", "portals", ...).
func (p *Proxier) retryFailures(failed []string) {
	if len(failed) == 0 {
		p.failedSyncs, p.failingSince, p.lastFailed = 0, time.Time{}, nil
		return
	}
	now := p.clk.Now()
	slices.Sort(failed)
	for _, f := range failed {
		if _, left := slices.BinarySearch(p.lastFailed, f); !left {
			p.failedSyncs = 0 // a new failure
			break
		}
	}
	if p.failedSyncs == 0 {
		p.failingSince = now
	}
	p.failedSyncs++
	p.lastFailed = failed
	d := retryBackoff(now.Sub(p.failingSince), p.opts.MinSyncPeriod, p.opts.SyncPeriod)
	klog.InfoS("Sync left work undone; retrying", "failures", len(failed), "after", d, "failedSyncsInARow", p.failedSyncs, "failingFor", now.Sub(p.failingSince))
	p.runner.RetryAfter(d)
}

// retryBackoff is the wait before the retry of work that has been failing
// for the given time: the short wait plus that time, so that retries alone
// double it.
func retryBackoff(failingFor, minInterval, maxInterval time.Duration) time.Duration {
	// Saturating: a min-sync-period of the largest duration (a "never")
	// plus the time failing wrapped negative, and the retry came every 1 s.
	d := time.Duration(mono.Add(int64(max(minInterval, time.Second)), max(failingFor, 0)))
	return max(min(d, maxInterval), time.Second)
}
