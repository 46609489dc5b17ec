package e2e

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// pinnedTo asks n times and returns the single backend that answered, or
// fails the test when answers differ or fail.
func pinnedTo(t *testing.T, cl harness.Client, s svc, n int) string {
	t.Helper()
	got, err := distribution(cl, "tcp", s.tcp(), n)
	if err != nil {
		t.Errorf("%s from %s: %v", s.tcp(), cl.Label, err)
	}
	if len(got) != 1 {
		t.Errorf("ClientIP affinity %s from %s: %d new connections spread as %s, want all on one backend", s.tcp(), cl.Label, n, got)
		return ""
	}
	for name := range got {
		return name
	}
	return ""
}

// checkAffinity: ClientIP affinity pins each client, independently.
func checkAffinity(t *testing.T, e *env) {
	s := e.svcs["sticky"]
	a := pinnedTo(t, e.pod1(ipSticky), s, distConns)
	b := pinnedTo(t, e.pod2(0), s, distConns)
	n := pinnedTo(t, e.node(), s, distConns)
	figure(t, "affinity ClientIP (timeout 10800 s): %d/%d to one backend per client; %s→%s %s→%s node→%s",
		distConns, distConns, e.pod1(ipSticky).Label, a, e.pod2(0).Label, b, n)
	// A second client's pin is independent: it is whatever round robin
	// gave it, and must not be undone by the first client's traffic.
	if b2 := pinnedTo(t, e.pod2(0), s, 3); b2 != b {
		t.Errorf("client %s moved from %s to %s after other clients' traffic", e.pod2(0).Label, b, b2)
	}
}

// gapTrial asks twice from one client with gap between, and reports
// whether both answers came from the same backend.
type gapResult struct {
	first, second string
	err           error
}

func gapTrial(cl harness.Client, s svc, start, gap time.Duration) gapResult {
	time.Sleep(start)
	var r gapResult
	if r.first, r.err = cl.Ask("tcp", s.tcp(), harness.AnswerTimeout); r.err != nil {
		return r
	}
	time.Sleep(gap)
	r.second, r.err = cl.Ask("tcp", s.tcp(), harness.AnswerTimeout)
	return r
}

// checkAffinityTrials repeats the seed's experiment on a Service with
// timeoutSeconds 3: twelve trials with a 1 s gap must all stay pinned;
// twelve with a 4 s gap are re-picked by round robin (with 3 backends the
// new pick usually differs); one client asking every 2 s, seven times,
// stays on one backend because every use refreshes the timer. All trials
// run at once, each from its own source address; random start offsets and
// gap jitter (as the seed's sleep had) keep the round-robin positions of the
// re-picks from lining up with the first picks.
func checkAffinityTrials(t *testing.T, e *env) {
	s := e.svcs["sticky3"]
	var wg sync.WaitGroup
	short := make([]gapResult, trialsEach)
	long := make([]gapResult, trialsEach)
	for i := 0; i < trialsEach; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			short[i] = gapTrial(e.pod1(ipTrial1s+i), s, jitter(time.Second), time.Second)
		}()
		go func() {
			defer wg.Done()
			long[i] = gapTrial(e.pod1(ipTrial4s+i), s, jitter(time.Second), 4*time.Second+jitter(600*time.Millisecond))
		}()
	}
	var chain []string
	var chainErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		cl := e.pod1(ipRefresh)
		for i := 0; i < 7; i++ {
			if i > 0 {
				time.Sleep(2 * time.Second)
			}
			name, err := cl.Ask("tcp", s.tcp(), harness.AnswerTimeout)
			if err != nil {
				chainErr = err
				return
			}
			chain = append(chain, name)
		}
	}()
	wg.Wait()

	sameShort, diffLong := 0, 0
	for i := range short {
		if short[i].err != nil || long[i].err != nil {
			t.Errorf("trial %d: errors 1 s: %v, 4 s: %v", i, short[i].err, long[i].err)
			continue
		}
		if short[i].first == short[i].second {
			sameShort++
		}
		if long[i].first != long[i].second {
			diffLong++
		}
	}
	distinct := map[string]bool{}
	for _, n := range chain {
		distinct[n] = true
	}
	figure(t, "affinity timeoutSeconds 3: 1 s gap same backend %d/%d; 4 s gap different backend %d/%d (seed: 12/12 and 8/12); every 2 s x7: %d distinct backend(s) %v",
		sameShort, trialsEach, diffLong, trialsEach, len(distinct), chain)
	if sameShort != trialsEach {
		t.Errorf("1 s gap (< timeout 3 s): only %d/%d trials stayed on their backend", sameShort, trialsEach)
	}
	// With round robin over 3 backends a re-pick lands elsewhere 2 times in
	// 3; fewer than 2 of 12 would mean the pin did not expire.
	if diffLong < 2 {
		t.Errorf("4 s gap (> timeout 3 s): only %d/%d trials changed backend; affinity does not seem to expire", diffLong, trialsEach)
	}
	if chainErr != nil || len(chain) != 7 || len(distinct) != 1 {
		t.Errorf("every 2 s x7 (each use refreshes the 3 s timer): got %v (err %v), want 7 answers from one backend", chain, chainErr)
	}
}

func jitter(max time.Duration) time.Duration {
	return time.Duration(rand.Int64N(int64(max)))
}

// checkAffinityExpiry is the deterministic form of the 4 s trial: a single
// client on its own Service, idle for 4 s with timeoutSeconds 3, must get the
// next endpoint in round-robin order, so a different one.
func checkAffinityExpiry(t *testing.T, e *env) {
	s := e.svcs["expire3"]
	cl := e.pod1(ipExpiry)
	r := gapTrial(cl, s, 0, 4*time.Second)
	figure(t, "affinity expiry (one client, timeout 3 s, idle 4 s): %s then %s", r.first, r.second)
	if r.err != nil {
		t.Fatalf("%s from %s: %v", s.tcp(), cl.Label, r.err)
	}
	if r.first == r.second {
		t.Errorf("after 4 s idle with timeoutSeconds 3 the client is still on %s; want a fresh round-robin pick", r.first)
	}
}

// checkRepin: the backend a client is pinned to disappears from the
// manifests; the client must be re-pinned to a survivor and stay there.
func checkRepin(t *testing.T, e *env) {
	s := e.svcs["repin"]
	cl := e.pod1(ipRepin)
	pinned := pinnedTo(t, cl, s, 5)
	if pinned == "" {
		t.FailNow()
	}
	var survivors = s
	survivors.endpoints = nil
	for _, b := range e.bs[:3] {
		if b.Name != pinned {
			survivors.endpoints = append(survivors.endpoints, b.Addr.Addr())
		}
	}
	writeSvc(t, e.p.dir, survivors)
	changed := time.Now()
	var first string
	moved := cl.WaitFor(t, "tcp", s.tcp(), changed, 3*time.Second, "re-pinned away from "+pinned+" after its removal from the manifests",
		func(name string, err error) bool { first = name; return err == nil && name != pinned })
	after := pinnedTo(t, cl, s, 5)
	figure(t, "re-pin: client %s pinned to %s; %s removed from manifests -> re-pinned to %s after %d ms, then %s x5",
		cl.Label, pinned, pinned, first, moved.Milliseconds(), after)
	if after != first {
		t.Errorf("after re-pin to %s the client went on to %s; want it to stay pinned", first, after)
	}
}
