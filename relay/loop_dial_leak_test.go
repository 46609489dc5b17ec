package relay

import (
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// socketsOpen counts the process's socket descriptors.
func socketsOpen(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n
}

// waitSocketsBack fails unless the process is back to at most base socket
// descriptors before long.
func waitSocketsBack(t *testing.T, base int, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := socketsOpen(t)
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sockets open, %d before: %s left its backend socket open", n, base, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A dial attempt that fails closes its socket, whether the endpoint
// refused it or it ran out of time: each failed attempt otherwise held a
// descriptor for the life of the process.
func TestLoopFailedDialsCloseTheirSockets(t *testing.T) {
	for _, tc := range []struct {
		name string
		ep   func(t *testing.T) (ep netip.AddrPort)
	}{
		{"refused", closedPort},
		{"timed out", silentBackend},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := tc.ep(t)
			b := newLoopBed(t, LoopOptions{DialTimeouts: []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond}})
			base := socketsOpen(t)
			h := newLoopHandler(ep)
			client, _ := b.connect(t, h, false)
			h.wait(t)
			expectReset(t, client)
			if client != nil {
				client.Close()
			}
			h.mu.Lock()
			fails := len(h.dialFails)
			h.mu.Unlock()
			if fails != 3 {
				t.Fatalf("%d dial failures, want 3", fails)
			}
			waitSocketsBack(t, base, "a failed dial ("+tc.name+")")
		})
	}
}
