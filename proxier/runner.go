package proxier

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// boundedFrequencyRunner runs fn at most once per minInterval on average and
// at least once per maxInterval, like kube-proxy's BoundedFrequencyRunner
// with the iptables proxier's burst of 2 (burstSyncs): a token bucket that
// refills one run per minInterval and holds two, so an isolated change
// right after a sync goes at once instead of waiting out the interval,
// while a stream of changes still collapses into one sync per minInterval;
// a quiet system still re-syncs (repair).
// fn learns which: periodic is true when maxInterval passed without a run.
// A minInterval of 0 runs fn for each trigger as it comes (triggers that
// arrive during a run still collapse into one run after it); between
// triggers the loop waits in its select, so it never spins.
type boundedFrequencyRunner struct {
	fn          func(periodic bool)
	minInterval time.Duration
	maxInterval time.Duration
	clk         clock.WithTicker
	trigger     chan struct{}

	mu sync.Mutex
	// tokens are the runs the bucket holds (at most burstRuns), as of
	// refilled; only with a minInterval.
	tokens   float64
	refilled time.Time
	// retry is what fn asked for with RetryAfter during its run (0: none).
	retry time.Duration
}

// burstRuns is how many runs may follow each other without waiting:
// kube-proxy's iptables proxier's burstSyncs.
const burstRuns = 2

func newBoundedFrequencyRunner(fn func(periodic bool), minInterval, maxInterval time.Duration, clk clock.WithTicker) *boundedFrequencyRunner {
	return &boundedFrequencyRunner{fn: fn, minInterval: minInterval, maxInterval: maxInterval, clk: clk, trigger: make(chan struct{}, 1)}
}

// Run asks for a run as soon as minInterval allows. It never blocks.
func (r *boundedFrequencyRunner) Run() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// RetryAfter asks for another run d after the current one ends: fn calls
// it when part of its work failed. Any run that comes sooner takes its
// place (it asks again if it fails too); of two requests in one run the
// sooner wins. Only a call made during a run counts: Loop reads the request
// when fn returns and clears it before the next run (a Proxier.Sync called
// directly, outside the loop, schedules nothing).
func (r *boundedFrequencyRunner) RetryAfter(d time.Duration) {
	r.mu.Lock()
	if r.retry == 0 || d < r.retry {
		r.retry = d
	}
	r.mu.Unlock()
}

// Loop runs until ctx ends. The first run happens on the first Run().
func (r *boundedFrequencyRunner) Loop(ctx context.Context) {
	periodic := r.clk.NewTimer(r.maxInterval)
	defer periodic.Stop()
	var retry clock.Timer
	var retryC <-chan time.Time // nil: no retry asked for
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		timedOut := false
		select {
		case <-ctx.Done():
			return
		case <-periodic.C():
			timedOut = true
		case <-retryC:
		case <-r.trigger:
			if wait := r.untilToken(); wait > 0 {
				t := r.clk.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C():
				}
			}
		}
		r.mu.Lock()
		r.take()
		r.retry = 0
		r.mu.Unlock()
		r.fn(timedOut)
		r.mu.Lock()
		again := r.retry
		r.mu.Unlock()
		if retry != nil {
			retry.Stop()
			retry, retryC = nil, nil
		}
		if again > 0 {
			retry = r.clk.NewTimer(again)
			retryC = retry.C()
		}
		// A trigger that arrived while fn ran stays queued: that change may
		// have missed this run. The periodic timer restarts from now.
		if !periodic.Stop() {
			select {
			case <-periodic.C():
			default:
			}
		}
		periodic.Reset(r.maxInterval)
	}
}

// untilToken is how long a triggered run must wait for the bucket to hold
// a run (0: at once).
func (r *boundedFrequencyRunner) untilToken() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.minInterval <= 0 {
		return 0
	}
	r.refill()
	if r.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - r.tokens) * float64(r.minInterval))
}

// take spends a run from the bucket (a periodic or retry run too, as
// kube-proxy's limiter counts every run); a run that waited for its token
// may find a hair less than one, and the bucket never goes below empty.
// Called with r.mu held.
func (r *boundedFrequencyRunner) take() {
	if r.minInterval <= 0 {
		return
	}
	r.refill()
	r.tokens = max(r.tokens-1, 0)
}

// refill adds the runs minInterval has earned since the last refill; the
// bucket starts full. Called with r.mu held.
func (r *boundedFrequencyRunner) refill() {
	now := r.clk.Now()
	if r.refilled.IsZero() {
		r.tokens = burstRuns
	} else {
		r.tokens = min(burstRuns, r.tokens+float64(now.Sub(r.refilled))/float64(r.minInterval))
	}
	r.refilled = now
}
