package proxier

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// boundedFrequencyRunner runs fn at most once per minInterval and at least
// once per maxInterval, like kube-proxy's BoundedFrequencyRunner: bursts of
// changes collapse into one sync, and a quiet system still re-syncs (repair).
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

	mu      sync.Mutex
	lastRun time.Time
	// retry is what fn asked for with RetryAfter during its run (0: none).
	retry time.Duration
}

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
			r.mu.Lock()
			wait := r.minInterval - r.clk.Since(r.lastRun)
			r.mu.Unlock()
			if !r.lastRun.IsZero() && wait > 0 {
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
		r.lastRun = r.clk.Now()
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
