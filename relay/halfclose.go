package relay

import (
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// halfClosed bounds the direction still running after the other one ended
// with a FIN (Options.HalfCloseTimeout): it ends (with a reset) only once
// nothing moved for a whole timeout, neither into its source nor out to
// its destination's reader, so a stream still flowing is never cut (a
// fixed deadline cut a backend streaming for longer than the bound).
// Progress is what the kernel says of both sockets (TCP_INFO: since the
// last data received; since the last data sent, while the reader
// acknowledges bytes), so the copy pays nothing per byte. The source alone
// did not do: a direction writing to a slow reader reads its source again
// only once a pipe (up to 1 MiB) went into the destination and its send
// buffer (up to 4 MiB) drained by a third, and any download slower than
// that per bound was reset mid-stream. A peer that stops reading stalls
// both; the abort then wakes the stalled write as well as the read.
//
// Only the first direction to end arms it (the second leaves nothing
// running to bound), and Run stops it and drops its references, so a
// finished connection leaves no timer and nothing reachable behind (a
// stopped timer can stay in the runtime's timer heap a while: it then
// holds this small struct, not the connection). A timer left to run out
// kept the whole connection reachable for the bound: 1,440 B of heap per
// connection for the binary's 2 minutes.
type halfClosed struct {
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
	c       *Conn
	// raw is the direction's source, dst its destination (asked for its
	// RawConn only when the timer fires: one allocation fewer per
	// connection); acked is what the destination's reader had
	// acknowledged at the last look.
	raw   syscall.RawConn
	dst   *net.TCPConn
	acked uint64
}

// watchHalfClosed starts the bound on the direction reading from conn;
// other is the socket it writes to. nil: no timer (the socket could not
// be asked, a deadline bounds it instead).
func watchHalfClosed(c *Conn, conn, other *net.TCPConn) *halfClosed {
	timeout := c.o.HalfCloseTimeout
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil
	}
	if _, ok := sinceLastReceived(raw); !ok {
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
		_ = other.SetWriteDeadline(time.Now().Add(timeout))
		return nil
	}
	h := &halfClosed{c: c, raw: raw, dst: other}
	h.mu.Lock()
	defer h.mu.Unlock()
	// A timer, not a goroutine; fire waits for mu, so it sees t set.
	h.t = time.AfterFunc(timeout, h.fire)
	return h
}

func (h *halfClosed) fire() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	idle, ok := sinceLastReceived(h.raw)
	if !ok {
		return // closed: the relay is done
	}
	var sent time.Duration
	var acked uint64
	var asked bool
	if dstRaw, err := h.dst.SyscallConn(); err == nil {
		_ = dstRaw.Control(func(fd uintptr) { sent, acked, asked = sinceLastSent(int(fd)) })
	}
	if asked && acked != h.acked {
		h.acked = acked
		idle = min(idle, sent)
	}
	// The bound runs from the last byte moved, not from this look:
	// re-arming a whole timeout when bytes had come since the last look
	// let a source that went quiet just after it idle up to twice the
	// bound.
	wait := h.c.o.HalfCloseTimeout - idle
	if wait <= 0 {
		h.c.abort()
		return
	}
	h.t.Reset(wait)
}

// stop ends the bound once both directions returned; nil: none.
func (h *halfClosed) stop() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.stopped = true
	if h.t != nil {
		h.t.Stop()
		h.t, h.c, h.raw, h.dst = nil, nil, nil, nil
	}
	h.mu.Unlock()
}

// sinceLastReceived is how long ago the socket last received data, to the
// kernel's tick (TCP_INFO's last_data_recv); false once it is closed.
func sinceLastReceived(raw syscall.RawConn) (idle time.Duration, ok bool) {
	_ = raw.Control(func(fd uintptr) { idle, ok = sinceLastReceivedFd(int(fd)) })
	return idle, ok
}

// sinceLastReceivedFd is sinceLastReceived of a descriptor (the event
// loop's sockets).
func sinceLastReceivedFd(fd int) (time.Duration, bool) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, false
	}
	return time.Duration(info.Last_data_recv) * time.Millisecond, true
}

// sinceLastSent is how long ago the socket last sent data, and how many
// bytes its peer acknowledged so far (TCP_INFO's last_data_sent and
// bytes_acked); false once it is closed. The time counts as the reader's
// progress only if the count moved since the last look (the first look
// has none to compare with): a retransmission to a peer that vanished is
// data sent, but no progress.
func sinceLastSent(fd int) (idle time.Duration, acked uint64, ok bool) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, 0, false
	}
	return time.Duration(info.Last_data_sent) * time.Millisecond, info.Bytes_acked, true
}
