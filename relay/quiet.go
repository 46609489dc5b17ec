package relay

import (
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"
)

// DefaultQuiet is how long both directions of a connection must have been
// silent before CloseWhenQuiet ends it: long enough that a request and
// its answer are not split, short enough that a kept-alive pool's idle
// connection qualifies between requests.
const DefaultQuiet = time.Second

// QuietEnd is how CloseWhenQuiet ended a connection, if it did.
type QuietEnd uint8

const (
	NotClosed        QuietEnd = iota // it ended otherwise (or first)
	ClosedQuiet                      // at a quiet moment
	ClosedAtDeadline                 // still busy at the close deadline
)

// sockQuiet is what the kernel says of one socket at a check.
type sockQuiet struct {
	sinceRecv time.Duration // since it last received data (TCP_INFO)
	queued    bool          // it holds sent bytes not yet acknowledged
}

// quietFor decides whether a connection whose sockets look like client and
// backend has been quiet for need (no byte received either way, nothing
// of ours still in flight) and, if not, how long to wait before asking
// again: until the more recent receipt is need old, or a fraction of need
// while bytes are only in flight.
func quietFor(client, backend sockQuiet, need time.Duration) (bool, time.Duration) {
	since := min(client.sinceRecv, backend.sinceRecv)
	switch {
	case since < need:
		return false, need - since
	case client.queued || backend.queued:
		return false, max(need/4, time.Millisecond)
	}
	return true, 0
}

// quietCloser ends a connection, gracefully, at its first quiet moment
// after a due time; requests (max age, drain) keep the earliest due time.
// One still busy a deadline after the due time is closed then (forced):
// a kept-alive pool's connection with a request always going is never
// quiet, and such pools are what max age and drain are for. It costs one
// timer per connection that has a due time, nothing per byte.
type quietCloser struct {
	clk   clock.WithDelayedExecution
	quiet time.Duration
	// deadline bounds the wait for quiet past the due time; 0: none.
	deadline time.Duration
	// state reads both sockets; false once the connection is gone.
	state func() (client, backend sockQuiet, ok bool)
	// close ends the connection (once); forced: at the deadline, busy.
	close func(forced bool)

	mu    sync.Mutex
	due   time.Time // zero: no request
	timer clock.Timer
	done  bool
}

// closeAt asks for the end at the first quiet moment from at on.
func (q *quietCloser) closeAt(at time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.done || (!q.due.IsZero() && !at.Before(q.due)) {
		return
	}
	q.due = at
	q.armLocked(max(at.Sub(q.clk.Now()), 0))
}

func (q *quietCloser) armLocked(d time.Duration) {
	if q.timer != nil {
		q.timer.Stop()
	}
	q.timer = q.clk.AfterFunc(d, q.check)
}

// check runs when a due time or a re-check comes.
func (q *quietCloser) check() {
	client, backend, ok := q.state()
	q.mu.Lock()
	if q.done {
		q.mu.Unlock()
		return
	}
	if !ok {
		q.done = true // the connection ended on its own
		q.mu.Unlock()
		return
	}
	quiet, wait := quietFor(client, backend, q.quiet)
	forced := false
	if !quiet && q.deadline > 0 {
		// check runs at or after the due time: due.Sub is small.
		left := q.deadline + q.due.Sub(q.clk.Now())
		forced = left <= 0
		wait = min(wait, left)
	}
	if !quiet && !forced {
		q.armLocked(wait)
		q.mu.Unlock()
		return
	}
	q.done = true
	q.mu.Unlock()
	q.close(forced)
}

// stop forgets any request (the connection ended).
func (q *quietCloser) stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.done = true
	if q.timer != nil {
		q.timer.Stop()
	}
}

// socketQuiet reads conn's TCP_INFO; false when it is closed.
func socketQuiet(conn *net.TCPConn) (sockQuiet, bool) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return sockQuiet{}, false
	}
	var s sockQuiet
	ok := false
	_ = raw.Control(func(fd uintptr) { s, ok = fdQuiet(int(fd)) })
	return s, ok
}

// fdQuiet is socketQuiet on a descriptor.
func fdQuiet(fd int) (sockQuiet, bool) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return sockQuiet{}, false
	}
	return sockQuiet{
		sinceRecv: time.Duration(info.Last_data_recv) * time.Millisecond,
		queued:    info.Notsent_bytes > 0 || info.Unacked > 0,
	}, true
}
