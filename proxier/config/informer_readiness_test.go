package config

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A check whose context ends returns then, not when a probe into a path
// that drops packets times out (2 s): a stop during an outage waited for it.
// The probe still ends for those that joined it, with its own answer.
func TestReadinessCheckEndsWithItsContext(t *testing.T) {
	// Closed, not sent on: a joining check that comes only after the
	// probe ended makes a probe of its own, which must not hang.
	release := make(chan struct{})
	var probes atomic.Int32
	r := newReadiness(func(ctx context.Context) bool {
		probes.Add(1)
		select {
		case <-release:
			return true
		case <-ctx.Done(): // as the real probe's request ends with its context
			return false
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan bool, 1)
	go func() { first <- r.now(ctx) }()
	joined := make(chan bool, 1)
	go func() {
		for probes.Load() == 0 { // the first check's probe is under way
			time.Sleep(time.Millisecond)
		}
		joined <- r.now(context.Background())
	}()
	for probes.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case ready := <-first:
		if ready {
			t.Error("a check whose context ended said ready")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a check whose context ended still waits for its probe after 5 s")
	}
	close(release)
	select {
	case ready := <-joined:
		if !ready {
			t.Error("the check that joined the probe was told not ready; the probe said ready")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the check that joined the probe not answered")
	}
	// 2 when the joining check came after the probe's end (a busy
	// machine): it then probed again.
	if n := probes.Load(); n > 2 {
		t.Errorf("%d probes for two checks, want at most 2", n)
	}
}

// TestReadinessProbesAgainAfterASlowProbe: a probe that outlasts the
// stream's next wait (a /readyz that times out on a path that drops
// packets) is followed by the next probe at once, the wait being counted
// from the probe's start. The stream's tick was answered instead from the
// "not ready" the slow probe had just given (now's cache for informers
// that fail together), so the next probe came a whole wait later (up to
// 3 s) and the waiters were told an answer no probe gave.
func TestReadinessProbesAgainAfterASlowProbe(t *testing.T) {
	started := make(chan time.Time, 8)
	release := make(chan struct{})
	r := newReadiness(func(ctx context.Context) bool {
		started <- time.Now()
		select {
		case <-release:
		case <-ctx.Done():
		}
		return false
	})
	r.every, r.cap = 500*time.Millisecond, 500*time.Millisecond // waits of 500-750 ms
	answers, done := r.wait()
	defer func() {
		done()
		close(release) // a probe still out ends
	}()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream made no probe")
	}
	// Longer than any wait of the stream: its timer is due when the probe
	// ends.
	time.Sleep(800 * time.Millisecond)
	ended := time.Now()
	release <- struct{}{}
	select {
	case next := <-started:
		if gap := next.Sub(ended); gap > 300*time.Millisecond {
			t.Fatalf("the next probe came %v after a probe that outlasted the wait; want it at once", gap.Round(time.Millisecond))
		}
	case <-answers:
		select {
		case <-started:
		case <-time.After(300 * time.Millisecond):
			t.Fatal("the stream told its waiter an answer without probing again after a probe that outlasted its wait")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no probe after the slow one")
	}
}

// The waits between a stream's probes count from each probe's start: after
// a probe that took longer than the wait (a path that drops packets, the
// probe timing out), the next one follows at once, not a whole wait later.
func TestReadinessWaitsCountFromEachProbesStart(t *testing.T) {
	const every = time.Second
	// slow outlasts the longest wait (every, stretched by the jitter).
	const slow = every + every*(readyPollJitter*10+2)/10
	var mu sync.Mutex
	var starts, ends []time.Time
	r := newReadiness(func(context.Context) bool {
		mu.Lock()
		first := len(starts) == 0
		starts = append(starts, time.Now())
		mu.Unlock()
		if first {
			time.Sleep(slow) // the probe timing out
		}
		mu.Lock()
		ends = append(ends, time.Now())
		mu.Unlock()
		return false
	})
	r.every, r.cap = every, every
	answers, done := r.wait()
	defer done()
	deadline := time.After(10 * time.Second)
	for {
		mu.Lock()
		n := len(starts)
		mu.Unlock()
		if n >= 2 {
			break
		}
		select {
		case <-answers:
		case <-deadline:
			t.Fatalf("%d probes in 10 s; want 2", n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if gap := starts[1].Sub(ends[0]); gap > every/2 {
		t.Fatalf("the probe after one that took %v started %v after it ended; want at once: the wait (%v, up to %v with jitter) counts from the probe's start", slow, gap.Round(time.Millisecond), every, time.Duration(float64(every)*(1+readyPollJitter)))
	}
}
