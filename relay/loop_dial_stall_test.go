package relay

import (
	"net/netip"
	"testing"
	"time"
)

// slowFirstBackend is a loopHandler whose first Backend call holds the
// loop for hold before it connects: what a loop held by the machine (GC,
// CPU starvation, a long batch of events) between reading its clock and
// polling for the dial's completion looks like to that dial.
type slowFirstBackend struct {
	*loopHandler
	hold time.Duration
}

func (h *slowFirstBackend) Backend(attempt int) (netip.AddrPort, error) {
	if attempt == 0 {
		time.Sleep(h.hold)
	}
	return h.loopHandler.Backend(attempt)
}

// A dial's time is the backend's: a connect that the backend's kernel
// answered at once is not timed out because the loop was held past the
// attempt's deadline before it looked. The loop fired its due timers
// before polling for the connect's completion, so after a stall of 250 ms
// (the proxier's first attempt) a connection whose backend answered in
// microseconds counted a dial failure and was dialled again, and under
// ClientIP affinity its client was re-pinned off a healthy endpoint.
func TestLoopDialNotTimedOutByAStalledLoop(t *testing.T) {
	const attempt = 200 * time.Millisecond
	b := newLoopBed(t, LoopOptions{DialTimeouts: []time.Duration{attempt, 5 * time.Second}})
	h := &slowFirstBackend{loopHandler: newLoopHandler(b.ep), hold: 3 * attempt}
	client, backend := b.connect(t, h, true) // the first connection the backend took
	h.connected(t)
	h.mu.Lock()
	fails := h.dialFails
	h.mu.Unlock()
	if len(fails) != 0 {
		t.Fatalf("dial failures %v: the backend answered the connect at once; the loop was held %v before it looked (attempt bound %v)", fails, h.hold, attempt)
	}
	pass(t, client, backend, "ping")
	pass(t, backend, client, "pong")
}
