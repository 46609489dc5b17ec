package relay

import (
	"math"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// timer runs a bound that came due.
func (c *LoopConn) timer(t *loopTimer) {
	l := c.l
	if c.state == stateDraining {
		c.abort() // the bound of resetWhenSent, the only timer armed
		return
	}
	switch t.kind {
	case timerDial:
		if connectEnded(c.fds[sideBackend]) {
			// The backend answered in time; the loop, held past the
			// attempt's deadline (GC, a starved machine), fires its
			// timers before it polls for the connect's event. Ended by
			// that event, it is no dial failure, nor a reason to dial
			// another endpoint (and move a ClientIP client off this
			// one); connected tells a refusal by SO_ERROR.
			c.connected(true)
			return
		}
		c.closeBackend()
		c.dialFailed(ErrDialTimeout)
		c.dial()
	case timerWriteUp, timerWriteDown:
		d := &c.up
		if t.kind == timerWriteDown {
			d = &c.down
		}
		if d.stallSince == 0 {
			return
		}
		if due := mono.Add(d.stallSince, l.o.WriteTimeout); due > l.now {
			l.timers.set(t, due)
			return
		}
		c.abort()
	case timerHalf:
		d := &c.up
		if c.up.done {
			d = &c.down
		}
		due := mono.Add(d.lastActive, l.o.HalfCloseTimeout)
		if due <= l.now {
			// Both looks, each may move lastActive on.
			if took, gave := c.readerTook(d), c.sourceGave(d); took || gave {
				due = mono.Add(d.lastActive, l.o.HalfCloseTimeout)
			}
		}
		if due > l.now {
			l.timers.set(t, due)
			return
		}
		c.abort()
	case timerQuiet:
		c.checkQuiet()
	case timerLiveness:
		if fd := c.fds[sideBackend]; fd >= 0 {
			// It fails only on a socket that is failing already,
			// which the relay finds out by itself.
			_ = l.o.Liveness.apply(fd)
		}
	}
}

// readerTook moves d.lastActive on to when dst's kernel last sent data,
// if its reader acknowledged bytes since the last look: bytes written
// earlier still going out of a full send buffer to a slow reader, which
// the loop sees no event of for as long as a third of the buffer takes
// to drain.
func (c *LoopConn) readerTook(d *loopDir) bool {
	sent, acked, ok := sinceLastSent(c.fds[d.dst])
	if !ok || acked == d.acked {
		return false
	}
	d.acked = acked
	d.lastActive = max(d.lastActive, c.l.now-int64(sent))
	return true
}

// sourceGave moves d.lastActive on to when src's kernel last received
// data, if that is later: bytes that came while the loop was held (a
// machine that starved it past the bound), which it has not read yet.
// Timers fire before the loop polls, and such a connection was reset as
// idle; the goroutine path reads the same kernel time (halfClosed).
func (c *LoopConn) sourceGave(d *loopDir) bool {
	fd := c.fds[d.src]
	if fd < 0 {
		return false
	}
	idle, ok := sinceLastReceivedFd(fd)
	if !ok {
		return false
	}
	at := c.l.now - int64(idle)
	if at <= d.lastActive {
		return false
	}
	d.lastActive = at
	return true
}

// quietAt asks for the end at the first quiet moment from at on.
func (c *LoopConn) quietAt(at int64) {
	if c.state == stateClosed || c.state == stateDraining || c.down.eof {
		return
	}
	if c.quietDue && c.quietFrom <= at {
		return // an earlier request stands
	}
	c.quietDue = true
	c.quietFrom = at
	c.closeBy = math.MaxInt64
	if d := c.l.o.CloseDeadline; d > 0 {
		c.closeBy = mono.Add(at, d)
	}
	c.l.timers.set(&c.timers[timerQuiet], max(at, c.l.now))
}

// recheckQuiet looks again after wait, or at the deadline if sooner; past
// it, the connection is closed now.
func (c *LoopConn) recheckQuiet(wait time.Duration) {
	l := c.l
	if l.now >= c.closeBy {
		c.endQuietly(true)
		return
	}
	l.timers.set(&c.timers[timerQuiet], min(mono.Add(l.now, wait), c.closeBy))
}

// endQuietly ends the backend→client direction as if the backend had
// sent a FIN: the client reads the end, as from a server closing an idle
// keep-alive connection. Forced (the deadline came before a quiet
// moment), the client→backend direction ends so too, as Conn's does.
// What was read is delivered first (step flushes before it passes the
// end on).
func (c *LoopConn) endQuietly(forced bool) {
	c.quietDue = false
	c.down.eof = true
	c.quietEnd = ClosedQuiet
	if forced {
		c.up.eof = true
		c.quietEnd = ClosedAtDeadline
	}
	c.pump()
}

func (c *LoopConn) checkQuiet() {
	l := c.l
	t := &c.timers[timerQuiet]
	if c.state == stateDialing {
		l.timers.set(t, mono.Add(l.now, l.o.Quiet/4+1))
		return
	}
	if c.up.pending() || c.down.pending() {
		c.recheckQuiet(max(l.o.Quiet/4, time.Millisecond))
		return
	}
	client, ok1 := fdQuiet(c.fds[sideClient])
	backend, ok2 := fdQuiet(c.fds[sideBackend])
	if !ok1 || !ok2 {
		c.quietDue = false // no timer left: a later request arms one
		return
	}
	if quiet, wait := quietFor(client, backend, l.o.Quiet); !quiet {
		c.recheckQuiet(wait)
		return
	}
	c.endQuietly(false)
}

// connectEnded reports whether the non-blocking connect on fd has ended,
// with a connection or an error (the socket is writable or failed), though
// the loop has not polled for its event yet.
func connectEnded(fd int) bool {
	if fd < 0 {
		return false
	}
	revents, err := rawio.PollOut(fd)
	return err == nil && revents&(unix.POLLOUT|unix.POLLERR|unix.POLLHUP) != 0
}
