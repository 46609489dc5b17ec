package config

import (
	"context"
	"math"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// readiness is the one owner of a source's /readyz probes: while any of its
// informers waits for the API server (patiently) or watches a hung call
// (raced), one stream of probes is made, at waits of every doubling to cap
// (jittered), and every waiter is told each answer. Each informer probed on
// its own schedule before: three streams per node, tripling what every node
// sent a server struggling to come back, for no earlier news.
type readiness struct {
	probe readyProbe
	// every is readyPollEvery and cap readyPollCap; tests shorten them.
	every, cap time.Duration

	mu sync.Mutex
	// waiters are told each answer of the stream (latest wins: buffer 1).
	waiters map[chan bool]struct{}
	// stop ends the stream; nil when none runs (no waiter).
	stop context.CancelFunc
	// inFlight is the probe under way (nil: none): a check joins it.
	inFlight *probeCall
	// notReadyAt is when the last probe said "not ready".
	notReadyAt time.Time
}

// probeCall is one probe that several may wait for.
type probeCall struct {
	done  chan struct{}
	ready bool
}

func newReadiness(probe readyProbe) *readiness {
	return &readiness{probe: probe, every: readyPollEvery, cap: readyPollCap, waiters: map[chan bool]struct{}{}}
}

// delays spaces the probes of one stream: every doubling to cap, each
// stretched by up to readyPollJitter.
func (r *readiness) delays() wait.DelayFunc {
	return wait.Backoff{Duration: r.every, Factor: 2, Jitter: readyPollJitter, Steps: math.MaxInt32, Cap: r.cap}.DelayFunc()
}

// now reports whether the server answers: the probe under way if there is
// one, "not ready" if a probe said so less than every ago (informers whose
// calls failed together, at an outage's start, ask together), else a probe
// of its own.
func (r *readiness) now(ctx context.Context) bool { return r.check(ctx, true) }

// check is now; recent says whether a "not ready" of less than every ago
// answers. The stream's probes are spaced by its own waits and take none:
// a probe that outlasted the next wait (a /readyz that times out on a path
// that drops packets) left one just said, so the tick due at its end was
// answered with it, unprobed, and the next probe came a whole wait later.
func (r *readiness) check(ctx context.Context, recent bool) bool {
	r.mu.Lock()
	c := r.inFlight
	if c == nil {
		if recent && !r.notReadyAt.IsZero() && time.Since(r.notReadyAt) < r.every {
			r.mu.Unlock()
			return false
		}
		c = &probeCall{done: make(chan struct{})}
		r.inFlight = c
		go r.run(ctx, c)
	}
	r.mu.Unlock()
	select {
	case <-c.done:
		return c.ready
	case <-ctx.Done(): // a stop does not wait for a probe into a dead path
		return false
	}
}

// run makes probe c. It runs to its end (the probe's own timeout bounds
// it) whoever started it: that caller's context ending must not read as
// "not ready" to the others that joined.
func (r *readiness) run(ctx context.Context, c *probeCall) {
	ready := r.probe(context.WithoutCancel(ctx))
	r.mu.Lock()
	c.ready = ready
	r.inFlight = nil
	if ready {
		r.notReadyAt = time.Time{}
	} else {
		r.notReadyAt = time.Now()
	}
	r.mu.Unlock()
	close(c.done)
}

// wait returns a channel told the answer of each probe of the stream from
// now on, and the function to call when done with it. The first waiter
// starts the stream, its first probe every from then; the last one ends it.
func (r *readiness) wait() (<-chan bool, func()) {
	answers := make(chan bool, 1)
	r.mu.Lock()
	r.waiters[answers] = struct{}{}
	if r.stop == nil {
		ctx, stop := context.WithCancel(context.Background())
		r.stop = stop
		go r.stream(ctx, r.delays())
	}
	r.mu.Unlock()
	return answers, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.waiters, answers)
		if len(r.waiters) == 0 && r.stop != nil {
			r.stop()
			r.stop = nil
		}
	}
}

// stream probes at delays until ctx ends, telling every waiter each
// answer. Each wait is counted from the probe's start, so that a probe
// that timed out (a path that drops packets) is not followed by a full one.
func (r *readiness) stream(ctx context.Context, delays wait.DelayFunc) {
	timer := time.NewTimer(delays())
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		probed := time.Now()
		ready := r.check(ctx, false)
		if ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		for answers := range r.waiters {
			select { // latest wins: a waiter is told the last answer
			case <-answers:
			default:
			}
			answers <- ready
		}
		r.mu.Unlock()
		timer.Reset(delays() - time.Since(probed))
	}
}
