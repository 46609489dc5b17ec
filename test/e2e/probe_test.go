package e2e

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// counts tallies answers by backend name; failures count under "ERR".
type counts map[string]int

func (c counts) String() string {
	names := make([]string, 0, len(c))
	for k := range c {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s=%d", k, c[k])
	}
	return strings.Join(parts, " ")
}

// sorted returns the counts of answering backends, largest first.
func (c counts) sorted() []int {
	var out []int
	for k, v := range c {
		if k != "ERR" {
			out = append(out, v)
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(out)))
	return out
}

// distribution asks dst n times, sequentially, each over a new connection
// (TCP) or from a new source port (UDP). The first error is returned too.
func distribution(cl harness.Client, proto string, dst netip.AddrPort, n int) (counts, error) {
	got := counts{}
	var first error
	for i := 0; i < n; i++ {
		name, err := cl.Ask(proto, dst, harness.AnswerTimeout)
		if err != nil {
			got["ERR"]++
			if first == nil {
				first = fmt.Errorf("attempt %d: %w", i+1, err)
			}
			continue
		}
		got[name]++
	}
	return got, first
}

// figure logs one line for the closing note.
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("FIGURE "+format, args...)
}

// askUDPAgain asks dst over UDP from cl, the same source port every time,
// up to 6 times with 500 ms for each answer: how a client that keeps its
// source port retries. It returns the attempts made, the time they took
// and the last error (nil: answered).
func askUDPAgain(cl harness.Client, dst netip.AddrPort) (int, time.Duration, error) {
	began := time.Now()
	var err error
	for attempt := 1; attempt <= 6; attempt++ {
		if _, err = cl.Ask("udp", dst, 500*time.Millisecond); err == nil {
			return attempt, time.Since(began), nil
		}
	}
	return 6, time.Since(began), err
}

// waitUntil polls ok every 100 ms and fails the test with what when it is
// still false after startBudget.
func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(startBudget)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, startBudget)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
