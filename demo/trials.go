package demo

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The timing experiments of the real cluster's measurement, run with timeoutSeconds 3.
const (
	trialCount   = 12
	shortGap     = 1 * time.Second // below the timeout: the pin must hold
	longGap      = 4 * time.Second // above it: the client is balanced afresh
	refreshEvery = 2 * time.Second
	refreshTimes = 7
	// trialStagger spaces the trials' first accesses so that their order,
	// and so the round-robin picks, is the same on every run.
	trialStagger = 100 * time.Millisecond
	// expiryProbe is when, before a long trial's second access, the
	// affinity table is read to see the entry gone (0.5 s after expiry).
	expiryProbe = 3500 * time.Millisecond
)

// Every trial is a client of its own, so all of them run at once and the
// whole thing takes about as long as the refresh series (12 s), not minutes.
func shortClient(i int) client { return client(21 + i) }
func longClient(i int) client  { return client(41 + i) }

const refreshClient client = 61

// trialResults is what the timing experiments observed.
type trialResults struct {
	shortSame   int      // short-gap trials answered twice by the same backend
	longExpired int      // long-gap trials whose entry was gone before the second access
	longChanged int      // long-gap trials whose second access went elsewhere
	refreshed   []string // the refresh client's backends, in order
	err         error
}

// timeoutTrials runs, concurrently: 12 trials of two accesses 1 s apart,
// 12 trials of two accesses 4 s apart, and one client accessing every 2 s,
// 7 times.
//
// Why the schedule is fixed: unlike kube-proxy's iptables mode, which
// re-picks at random, this proxy re-picks round robin, so whether a
// long-gap client lands elsewhere depends on how many other clients picked
// between its two accesses. The refresh client picks first, then trial i
// makes its short and its long first access at start+(i+1)*100ms; sticky
// accesses do not move the cursor. Between long client i's two picks come
// the 2*(11-i) first picks of the later trials and the i second picks of
// the earlier long ones, 22-i in all, so it lands on the same backend again
// exactly when 22-i+1 is a multiple of 3: 4 of 12 same, 8 changed. (The
// schedule also fixes the cursor afterwards: 39 picks since client 1's, so
// client 1's next fresh pick is its first backend again.)
func (l *lab) timeoutTrials(ctx context.Context) trialResults {
	addr, err := l.proxyAddr(stickyServicePort)
	if err != nil {
		return trialResults{err: err}
	}
	var (
		mu  sync.Mutex
		res trialResults
		wg  sync.WaitGroup
	)
	record := func(f func()) {
		mu.Lock()
		defer mu.Unlock()
		f()
	}
	fail := func(err error) { record(func() { res.err = firstErr(res.err, err) }) }
	access := func(from client) (string, bool) {
		name, err := l.access(ctx, addr, from)
		if err != nil {
			fail(err)
			return "", false
		}
		return name, true
	}

	start := time.Now()
	first, ok := access(refreshClient)
	if !ok {
		return res
	}
	res.refreshed = append(res.refreshed, first)
	wg.Go(func() {
		for k := 1; k < refreshTimes; k++ {
			if err := sleepUntil(ctx, start.Add(time.Duration(k)*refreshEvery)); err != nil {
				fail(err)
				return
			}
			name, ok := access(refreshClient)
			if !ok {
				return
			}
			record(func() { res.refreshed = append(res.refreshed, name) })
		}
	})

	for i := range trialCount {
		if err := sleepUntil(ctx, start.Add(time.Duration(i+1)*trialStagger)); err != nil {
			fail(err)
			break
		}
		short, long := shortClient(i), longClient(i)
		shortFirst, ok1 := access(short)
		longFirst, ok2 := access(long)
		if !ok1 || !ok2 {
			break
		}
		at := time.Now()
		wg.Go(func() {
			if err := sleepUntil(ctx, at.Add(shortGap)); err != nil {
				fail(err)
				return
			}
			if name, ok := access(short); ok && name == shortFirst {
				record(func() { res.shortSame++ })
			}
		})
		wg.Go(func() {
			if err := sleepUntil(ctx, at.Add(expiryProbe)); err != nil {
				fail(err)
				return
			}
			if _, pinned := l.pinnedTo(stickyServicePort, long); !pinned {
				record(func() { res.longExpired++ })
			}
			if err := sleepUntil(ctx, at.Add(longGap)); err != nil {
				fail(err)
				return
			}
			if name, ok := access(long); ok && name != longFirst {
				record(func() { res.longChanged++ })
			}
		})
	}
	wg.Wait()
	return res
}

func firstErr(have, next error) error {
	if have != nil {
		return have
	}
	return next
}

// rows turns the results into the table's three timing rows.
func (r trialResults) rows() []row {
	short := row{Experiment: "12 clients connect twice, 1 s apart (under the 3 s timeout)", Expected: "12/12 back on the same pod"}
	long := row{Experiment: "12 clients connect twice, 4 s apart (past the 3 s timeout)", Expected: "affinity expired; 8/12 moved to another pod (random pick)"}
	refresh := row{Experiment: "1 client connects every 2 s, 7 times", Expected: "one pod for all 7 (each one restarts the timeout)"}
	if r.err != nil {
		for _, each := range []*row{&short, &long, &refresh} {
			each.Ours = "error: " + r.err.Error()
		}
		return []row{short, long, refresh}
	}
	short.Ours = fmt.Sprintf("%d/%d back on the same backend", r.shortSame, trialCount)
	short.Matched = r.shortSame == trialCount
	// Re-picked is the outcome: the entry was gone once 3 s had passed. How
	// many then changed backend is the balancing algorithm's business.
	long.Ours = fmt.Sprintf("expired for %d/%d; %d/%d moved", r.longExpired, trialCount, r.longChanged, trialCount)
	long.Matched = r.longExpired == trialCount && r.longChanged > 0
	distinct := map[string]bool{}
	for _, n := range r.refreshed {
		distinct[n] = true
	}
	refresh.Ours = fmt.Sprintf("%d backends over %d", len(distinct), len(r.refreshed))
	if len(distinct) == 1 {
		refresh.Ours = fmt.Sprintf("one backend for all %d", len(r.refreshed))
	}
	refresh.Matched = len(distinct) == 1 && len(r.refreshed) == refreshTimes
	return []row{short, long, refresh}
}
