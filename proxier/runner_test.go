package proxier

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// runInBackground runs loop on a goroutine until the test ends, and waits
// for it to return.
func runInBackground(t *testing.T, loop func(context.Context)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { loop(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// The runner lets two runs follow each other at once (kube-proxy's burst
// of 2), then collapses a burst of triggers into one run per minInterval,
// and runs on its own every maxInterval.
func TestBoundedFrequencyRunner(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	var runs, periodicRuns atomic.Int32
	r := newBoundedFrequencyRunner(func(periodic bool) {
		if periodic {
			periodicRuns.Add(1)
		}
		runs.Add(1)
	}, time.Second, 30*time.Second, clk)
	runInBackground(t, r.Loop)

	r.Run()
	waitFor(t, "first run", func() bool { return runs.Load() == 1 })
	// The second run of the burst goes at once, the clock unmoved.
	r.Run()
	waitFor(t, "second run, the burst's", func() bool { return runs.Load() == 2 })

	// With the bucket empty a trigger waits for minInterval: the first is
	// taken into the wait, the other four collapse into one queued run.
	r.Run()
	waitFor(t, "trigger taken", func() bool { return len(r.trigger) == 0 })
	// The fake clock's time may only move once the loop's wait is armed
	// (the periodic timer and this one): a step between its reading of
	// the clock and its NewTimer would push the deadline out by the step.
	waitFor(t, "minInterval wait armed", func() bool { return clk.Waiters() == 2 })
	for range 4 {
		r.Run()
	}
	clk.Step(500 * time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	if n := runs.Load(); n != 2 {
		t.Fatalf("ran %d times before minInterval passed", n)
	}
	clk.Step(500 * time.Millisecond)
	waitFor(t, "rate-limited run", func() bool { return runs.Load() == 3 })
	waitFor(t, "queued trigger taken", func() bool { return len(r.trigger) == 0 })
	waitFor(t, "minInterval wait armed", func() bool { return clk.Waiters() == 2 })
	clk.Step(time.Second)
	waitFor(t, "collapsed run", func() bool { return runs.Load() == 4 })
	time.Sleep(20 * time.Millisecond)
	if n := runs.Load(); n != 4 {
		t.Fatalf("5 triggers gave %d runs, want 2", n-2)
	}

	// Quiet: the periodic run comes after maxInterval.
	if n := periodicRuns.Load(); n != 0 {
		t.Fatalf("%d triggered runs were called periodic", n)
	}
	// The loop re-arms the periodic timer after fn returns, which the test
	// cannot see: a step that came first fired the old timer, whose tick
	// the re-arming drops. Step again until the run comes.
	for step := 0; runs.Load() < 5; step++ {
		if step == 3 {
			t.Fatal("no periodic run after 3 steps of maxInterval")
		}
		clk.Step(30 * time.Second)
		deadline := time.Now().Add(time.Second)
		for runs.Load() < 5 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	if n := periodicRuns.Load(); n != 1 {
		t.Fatalf("the periodic run was not told so (%d periodic runs)", n)
	}
}

func TestNoSyncBeforeSourcesSynced(t *testing.T) {
	p, fake := newPortalProxierUnsynced(t)
	p.OnServiceAdd(makeService("web"))
	p.Sync()
	if len(fake.Writes()) != 0 || len(p.DebugServices()) != 0 {
		t.Fatalf("synced before the sources: %d writes, %d ports", len(fake.Writes()), len(p.DebugServices()))
	}
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.Sync()
	if len(p.DebugServices()) != 1 {
		t.Fatalf("not serving after both sources synced")
	}
}

// TestMinSyncPeriod: a MinSyncPeriod given as 0 (--iptables-min-sync-period
// 0) is kube-proxy's "no minimum": each change is synced as soon as it
// arrives, without the clock moving, and a proxier with nothing to do
// does not spin. Options that leave it unset, or give a negative one,
// keep the 1 s default; a given period holds a change back that long,
// once the burst of two runs is spent.
func TestMinSyncPeriod(t *testing.T) {
	for _, tc := range []struct {
		name string
		min  time.Duration
		set  bool
		want time.Duration
	}{
		{"unset: the default", 0, false, time.Second},
		{"0 given: no minimum", 0, true, 0},
		{"2s given", 2 * time.Second, true, 2 * time.Second},
		{"negative: the default", -time.Second, true, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			p := New(Options{BindAddress: mustAddr("127.0.0.1"), Clock: clk, SyncPeriod: time.Hour,
				MinSyncPeriod: tc.min, MinSyncPeriodSet: tc.set})
			if p.runner.minInterval != tc.want {
				t.Errorf("minimum sync interval %v, want %v", p.runner.minInterval, tc.want)
			}
			var started, runs atomic.Int32
			sync := p.runner.fn
			// runs counts a sync once it is done: counted at its start, a
			// Service added while the first sync still ran was in that
			// sync, served with no wait (1 run in ~50 under load).
			p.runner.fn = func(periodic bool) { started.Add(1); sync(periodic); runs.Add(1) }
			runInBackground(t, p.Run)
			p.OnServiceSynced()
			p.OnEndpointSlicesSynced()
			waitFor(t, "the first sync", func() bool { return runs.Load() == 1 })

			for i, name := range []string{"a", "b", "c"} {
				serving := func() bool { _, ok := p.ProxyPort("default/" + name + ":p"); return ok }
				p.OnServiceAdd(makeService(name, withClusterIP(fmt.Sprintf("10.96.0.%d", 20+i))))
				if tc.want > 0 && i > 0 {
					// The first change after the first sync is the burst's
					// second run and goes at once; from then on each waits.
					// The periodic sync, the affinity sweep, and the wait.
					waitFor(t, "the minimum wait armed", func() bool { return clk.Waiters() == 3 })
					time.Sleep(20 * time.Millisecond)
					if serving() {
						t.Fatalf("%s synced before the minimum interval passed", name)
					}
					clk.Step(tc.want)
				}
				waitFor(t, name+" synced", serving)
			}
			// Idle: no sync without a change (nor a spinning loop). The
			// last one may still be ending: c shows as served before its
			// sync returns.
			waitFor(t, "the last sync to end", func() bool { return runs.Load() == started.Load() })
			n := started.Load()
			time.Sleep(50 * time.Millisecond)
			if extra := started.Load() - n; extra != 0 {
				t.Fatalf("%d syncs with nothing changed", extra)
			}
		})
	}
}

// service_changes_pending counts the Services changed since the last sync,
// as kube-proxy's does: five edits of one Service are one pending change
// (it counted events), and a sync brings it back to 0.
func TestServiceChangesPendingCountsServices(t *testing.T) {
	p := New(Options{BindAddress: mustAddr("127.0.0.1")})
	svc := makeService("web")
	for range 5 {
		p.OnServiceUpdate(svc, svc.DeepCopy())
	}
	p.OnServiceAdd(makeService("db", withClusterIP("10.96.0.20")))
	if got := testutil.ToFloat64(p.metrics.ServiceChangesPending); got != 2 {
		t.Errorf("pending %v, want 2 (two Services)", got)
	}
	if got := testutil.ToFloat64(p.metrics.ServiceChangesTotal); got != 6 {
		t.Errorf("total %v, want 6 (every change)", got)
	}
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.Sync()
	if got := testutil.ToFloat64(p.metrics.ServiceChangesPending); got != 0 {
		t.Errorf("pending after the sync %v, want 0", got)
	}
	stopNow(p)
}
