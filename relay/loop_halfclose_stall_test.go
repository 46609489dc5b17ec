package relay

import (
	"io"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// stallingHandler holds its loop in Connected (an event the loop serves
// after a poll) until until: what a loop held by the machine (GC, CPU
// starvation) after it polled looks like to the connections it serves.
type stallingHandler struct {
	*loopHandler
	until time.Time
	ended chan time.Time
}

func (h *stallingHandler) Connected(c *LoopConn, ep netip.AddrPort) {
	time.Sleep(time.Until(h.until))
	h.ended <- time.Now()
	h.loopHandler.Connected(c, ep)
}

// The half-close bound counts from the last byte the kernel received
// (README): bytes that came while the loop was held are activity, though
// the loop has not read them yet. It fired its due timers before polling
// for them, and reset a connection whose backend had sent 700 ms before
// (bound 1 s) as idle.
func TestLoopHalfCloseBoundCountsBytesAStalledLoopHasNotRead(t *testing.T) {
	const bound = time.Second
	b := newLoopBed(t, LoopOptions{HalfCloseTimeout: bound})
	h := newLoopHandler(b.ep)
	client, backend := b.connect(t, h, true)
	_ = client.CloseWrite()
	if _, err := io.ReadAll(backend); err != nil {
		t.Fatal(err)
	}
	halfClosed := time.Now() // the loop saw the FIN before the backend read it
	// Hold A's loop from 300 ms after the half-close until 1.5 s after it.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	time.Sleep(300 * time.Millisecond)
	stall := &stallingHandler{loopHandler: newLoopHandler(b.ep), until: halfClosed.Add(1500 * time.Millisecond), ended: make(chan time.Time, 1)}
	l := h.loopConn(t).l
	l.held.Add(1)
	if !l.post(loopCmd{op: cmdAdopt, fd: fds[0], h: stall}) {
		t.Fatal("the loop took no command")
	}
	// While it is held, the backend sends: 700 ms before the loop wakes.
	time.Sleep(time.Until(halfClosed.Add(800 * time.Millisecond)))
	sent := time.Now()
	if _, err := backend.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	woke := <-stall.ended
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 4)
	if _, err := io.ReadFull(client, got); err != nil {
		if idle := woke.Sub(sent); idle >= bound || sent.Sub(halfClosed) >= bound {
			t.Skipf("no verdict: the machine held the test so that the backend was idle %v when the loop woke (bound %v): %v", idle, bound, err)
		}
		t.Fatalf("client read %q, %v; want the bytes the backend sent %v before the loop woke (bound %v)", got, err, woke.Sub(sent).Round(time.Millisecond), bound)
	}
}
