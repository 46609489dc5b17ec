package relay

import (
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// The two sockets of a LoopConn (index of fds and of the readiness flags).
const (
	sideClient  = 0
	sideBackend = 1
)

// connection states
const (
	stateDialing uint8 = iota
	stateRelaying
	// stateDraining: a peer reset; what it sent before its reset is still
	// being passed on to the other peer, who gets the reset once it all
	// went out (resetWhenSent), within salvageBound.
	stateDraining
	stateClosed
)

// A connection's turn ends after turnBudget read/write rounds or once it
// moved turnBytes, so that a bulk stream (a splice moves up to 1 MiB)
// delays the other connections of its loop by about a millisecond, not by
// the 16 MiB it could otherwise move in one turn; it is queued to go on.
const (
	turnBudget = 16
	turnBytes  = 256 << 10
)

// LoopConn is one connection on a loop. Everything but its byte counts
// belongs to the loop's goroutine.
type LoopConn struct {
	l    *Loop
	h    Handler
	slot int32
	// fds (-1: none); readable and writable are what epoll last said,
	// cleared when a call says EAGAIN (edge-triggered: the next event sets
	// them again).
	fds                [2]int
	readable, writable [2]bool
	state              uint8
	queued             bool
	// resetSide is the side that gets the reset once what is queued to it
	// went out (stateDraining).
	resetSide uint8
	// errHup: an event of the socket said EPOLLERR or EPOLLHUP (a reset,
	// mostly), which a read may find queued behind bytes (step).
	errHup [2]bool
	// ackHeld: the backend socket is in the delayed-ACK mode that held
	// its handshake's ACK, until the first write to it (write).
	ackHeld bool
	attempt int
	ep      netip.AddrPort
	dialErr error
	// tags are what each socket's epoll events carry besides the slot,
	// unique per registration in the loop (tag&1 is the side): an event
	// of a socket closed since — an earlier dial attempt's, or a finished
	// connection's whose descriptor a forked child still held for a
	// moment, so epoll still reported it — is told from the current
	// socket's even when its slot was taken again.
	tags [2]int32

	up, down loopDir
	timers   [numTimers]loopTimer
	// quietDue: a CloseWhenQuiet is pending (its timer then runs);
	// quietFrom is when the earliest pending request came due (the
	// timer, which a busy connection's re-checks move on, is no
	// measure of it); closeBy is when it closes the connection even if
	// busy (loop time; max int64: no deadline). quietEnd is how it ended
	// the connection.
	quietDue  bool
	quietEnd  QuietEnd
	quietFrom int64
	closeBy   int64

	// in and out are read by other goroutines (Bytes).
	in, out atomic.Int64
}

// loopDir is one direction: it reads fds[src], writes fds[dst].
type loopDir struct {
	src, dst uint8
	// pending bytes: buf[off:n] (buffered) or inPipe bytes in pipe.
	buf      *[]byte
	off, n   int
	pipe     pipePair
	hasPipe  bool
	inPipe   int
	splicing bool
	noPipe   bool
	// eof: src sent its FIN (fin) or the relay ends this direction as if
	// it had (CloseWhenQuiet); done: the FIN was passed on.
	eof, fin, done bool
	// lastActive is when src last gave bytes, dst last took some, or
	// (readerTook) dst's kernel last sent its reader some: the half-close
	// bound's measure of progress (halfClosed tells why reads alone do
	// not do); acked is what dst's reader had acknowledged at the last
	// look.
	lastActive int64
	acked      uint64
	// stallSince is when dst last took bytes while bytes wait for it; 0:
	// nothing waits on a full dst.
	stallSince int64
	count      *atomic.Int64
}

func (d *loopDir) pending() bool { return d.n > d.off || d.inPipe > 0 }

// Bytes is what the connection moved so far: client→backend, back.
func (c *LoopConn) Bytes() (in, out int64) { return c.in.Load(), c.out.Load() }

// CloseWhenQuiet ends the connection at its first quiet moment at least d
// from now, as Conn.CloseWhenQuiet does. Safe from any goroutine.
func (c *LoopConn) CloseWhenQuiet(d time.Duration) {
	c.l.post(loopCmd{op: cmdQuiet, c: c, at: mono.Add(c.l.clock(), d)})
}

// QuietEnd tells whether CloseWhenQuiet ended the connection, and how;
// the loop's goroutine reads it (Handler.Ended).
func (c *LoopConn) QuietEnd() QuietEnd { return c.quietEnd }

// Reset ends the connection with a reset to both peers (a fault's cut of
// live connections). Safe from any goroutine, also after the end.
func (c *LoopConn) Reset() { c.l.post(loopCmd{op: cmdReset, c: c}) }

// newConn is a connection in its dialing state on l, in a slot of its own.
func (l *Loop) newConn(h Handler, client, backend int) *LoopConn {
	c := &LoopConn{l: l, h: h, fds: [2]int{client, backend}}
	c.up = loopDir{src: sideClient, dst: sideBackend, count: &c.in}
	c.down = loopDir{src: sideBackend, dst: sideClient, count: &c.out}
	for i := range c.timers {
		c.timers[i] = loopTimer{c: c, index: -1, kind: uint8(i)}
	}
	c.slot = l.slot(c)
	return c
}

// event applies one epoll event of the socket tagged tag.
func (c *LoopConn) event(ev uint32, tag int32) {
	side := tag & 1
	if tag != c.tags[side] {
		return // a socket closed since (see tags)
	}
	if c.state == stateClosed || c.fds[side] < 0 {
		return
	}
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.readable[side] = true
	}
	if ev&(unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.errHup[side] = true
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.writable[side] = true
	}
	if c.state == stateDialing {
		switch {
		case side == sideBackend && ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0:
			c.connected(ev&(unix.EPOLLHUP|unix.EPOLLERR) != 0)
		case side == sideClient && ev&(unix.EPOLLHUP|unix.EPOLLERR) != 0 &&
			rawio.TCPState(c.fds[sideClient]) == rawio.TCPClose:
			// The client reset (or the kernel ended its connection with
			// an error): nobody to dial for, no endpoint at fault. Its
			// FIN alone (EPOLLRDHUP) is no end: a client may send its
			// request and half-close before the backend answers.
			c.fail(ErrClientGone)
		}
		return
	}
	if c.state == stateDraining {
		c.drain()
		return
	}
	if ev&(unix.EPOLLHUP|unix.EPOLLERR) != 0 && c.resetAfterEnd(side) {
		return
	}
	c.pump()
}

// resetAfterEnd passes on a reset of a socket whose direction has ended
// (its FIN passed on): nothing reads it any more, and the direction still
// running, waiting on the other socket, would not learn of the reset
// before the half-close bound. Only a hang-up or error event asks (a FIN
// sent both ways ends the connection first, so on a live one it is a
// reset): one system call per such event, nothing per byte.
func (c *LoopConn) resetAfterEnd(side int32) bool {
	d := &c.up
	if side == sideBackend {
		d = &c.down
	}
	if !d.done {
		return false
	}
	err := c.resetOf(side)
	if err == nil {
		return false
	}
	c.failed(d, err)
	return true
}

// resetOf is the reset the socket of side took, if any: its error
// (SO_ERROR, which takes it), or ECONNRESET for the CLOSE state a reset
// leaves once the error was taken. Only for a socket no FIN of ours went
// to: one that did reaches CLOSE without a reset too.
func (c *LoopConn) resetOf(side int32) error {
	err := rawio.SocketError(c.fds[side])
	if err == nil && rawio.TCPState(c.fds[side]) == rawio.TCPClose {
		err = unix.ECONNRESET // the error was taken already
	}
	return err
}

// pump moves what both directions can move now, for one turn.
func (c *LoopConn) pump() {
	if c.state != stateRelaying {
		if c.state == stateDraining {
			c.drain()
		}
		return
	}
	more := false
	start := c.in.Load() + c.out.Load()
	for range turnBudget {
		up, err := c.step(&c.up)
		if err != nil {
			c.failed(&c.up, err)
			return
		}
		down, err := c.step(&c.down)
		if err != nil {
			c.failed(&c.down, err)
			return
		}
		if c.up.done && c.down.done {
			c.finish()
			return
		}
		if !up && !down {
			c.resetBehindStall()
			return
		}
		more = true
		if c.in.Load()+c.out.Load()-start >= turnBytes {
			break
		}
	}
	if more {
		c.l.queue(c)
	}
}

// resetBehindStall passes on a reset of a socket its direction does not
// read because it is stalled: what it read waits for a destination that
// takes nothing (a backend that stopped reading an upload), and step
// reads a source only once its destination is writable. The reset would
// wait behind that write until the write bound ran out (a minute by
// default), holding both sockets, their buffers and the other peer's
// connection, where a reset the relay reads reaches the other peer within
// salvageBound (resetWhenSent). Asked only when neither direction moved
// and a hang-up or error event of the source came (errHup): nothing per
// byte. A socket a FIN of ours went to (the other direction ended) is
// left to the half-close bound: it reaches CLOSE without a reset too
// (resetOf).
func (c *LoopConn) resetBehindStall() {
	for _, d := range [...]*loopDir{&c.up, &c.down} {
		if d.done || c.writable[d.dst] || !c.errHup[d.src] || c.other(d).done {
			continue
		}
		if err := c.resetOf(int32(d.src)); err != nil {
			c.failed(d, err)
			return
		}
	}
}

// step does one round of d: flush what waits for dst, pass a FIN on, or
// read what src has. It reports whether anything moved. A read failure is
// returned as is, a write failure as a *WriteError.
func (c *LoopConn) step(d *loopDir) (bool, error) {
	if d.done {
		return false, nil
	}
	l := c.l
	if d.pending() {
		if !c.writable[d.dst] {
			return false, nil
		}
		return c.flush(d)
	}
	if d.eof {
		d.done = true
		if other := c.other(d); other.done && other.fin {
			// dst's peer sent its FIN and we read to it: nothing unread
			// is left on dst, so closing it (next, both directions done)
			// sends our FIN as shutdown would, one system call fewer
			// per connection.
			return true, nil
		}
		_ = rawio.ShutdownWrite(c.fds[d.dst])
		c.directionEnded(d)
		return true, nil
	}
	if !c.readable[d.src] || !c.writable[d.dst] {
		return false, nil
	}
	src := c.fds[d.src]
	if d.splicing && !d.hasPipe {
		c.startSplicing(d) // a burst goes on: a pipe again
	}
	if d.splicing {
		n, err := rawio.Splice(src, d.pipe.w, spliceChunk)
		if n == 0 && err != unix.EINTR {
			// Nothing came: src is empty for now, ended or failed. The
			// pipe is empty (step reads only once nothing is pending)
			// and goes back, so neither an idle connection nor a
			// half-closed one holds one (a FIN right after a burst kept
			// it to the connection's end). The direction stays in splice
			// mode until a splice moves less than a buffer (the burst is
			// over): a stream that outruns its reader empties src on
			// most wake-ups, and reading those back through the buffer
			// cost 1 stream 16 % of its rate.
			pipes.put(d.pipe, true)
			d.hasPipe = false
			if (err == nil || err == unix.EAGAIN) && rawio.AtMark(src) {
				// Not empty, nor ended: an urgent byte's mark heads src.
				// splice stops there, saying EAGAIN at this and every
				// wake-up to come, or end of file once a FIN is queued
				// too: the stream would stall for good, or lose what
				// follows the mark. A read steps over it (the urgent
				// byte, not inline, is left out, as a read-based proxy
				// leaves it): read now, as after EINTR.
				d.splicing = false
				return true, nil
			}
		}
		if ok, moved, err := c.received(d, n, err); !ok {
			return moved, err
		}
		d.inPipe = int(n)
		if n < autoBufSize {
			d.splicing = false // the burst is over: back to reads once drained
		}
		return c.flush(d)
	}
	n, inq, err := rawio.RecvInq(src, l.scratch)
	if ok, moved, err := c.received(d, int64(n), err); !ok {
		return moved, err
	}
	if inq == 0 && !c.errHup[d.src] {
		// Nothing queued, no FIN: skip the EAGAIN read. Not once an event
		// said error or hang-up: the hint counts no reset, and a reset
		// queued behind these bytes came with that event, the last
		// wake-up it gives; the next read returns it. (A reset arriving
		// after the event raises one of its own.)
		c.readable[d.src] = false
	}
	if n == len(l.scratch) && inq != 0 && !d.noPipe {
		// Bulk is queued: splice it. (With src emptied, a pipe taken now
		// would be held while the connection idles.)
		c.startSplicing(d)
	}
	m, err := c.write(d, l.scratch[:n])
	if err != nil {
		d.count.Add(-int64(n - m)) // read, never delivered (finish takes back only what waits)
		return false, &WriteError{err}
	}
	if m < n {
		d.buf = autoBufs.Get().(*[]byte)
		d.off, d.n = 0, copy(*d.buf, l.scratch[m:n])
		c.stalled(d)
	}
	return true, nil
}

// received applies a read's outcome to d. ok: bytes came (counted); else
// the step ends with moved and err: src is empty (EAGAIN), EOF (now
// pending a FIN), EINTR (try again) or a failure.
func (c *LoopConn) received(d *loopDir, n int64, err error) (ok, moved bool, _ error) {
	switch {
	case err == unix.EAGAIN:
		c.readable[d.src] = false
		return false, false, nil
	case err == unix.EINTR:
		return false, true, nil
	case err != nil:
		return false, false, err
	case n == 0:
		if c.errHup[d.src] && !c.other(d).done {
			// A read returns the FIN before a pending error, and the
			// event of a reset right behind the FIN was the FIN's, so
			// resetAfterEnd hears of it no more: passed on as a FIN, the
			// reset reached the other peer only at the half-close bound.
			// Only an error or hang-up event asks: a FIN alone says
			// neither while no FIN of ours went to src (no system call).
			if err := c.resetOf(int32(d.src)); err != nil {
				return false, false, err
			}
		}
		d.eof, d.fin = true, true
		return false, true, nil
	}
	d.lastActive = c.l.now
	d.count.Add(n)
	return true, false, nil
}

// write writes p to d's dst until it is full; EAGAIN is not an error.
func (c *LoopConn) write(d *loopDir, p []byte) (int, error) {
	fd := c.fds[d.dst]
	done := 0
	for done < len(p) {
		m, err := rawio.Send(fd, p[done:])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			c.writable[d.dst] = false
			return done, nil
		case err != nil:
			return done, err
		}
		done += m
	}
	if c.ackHeld && d.dst == sideBackend && done > 0 {
		c.ackHeld = false
		sendHandshakeACK(fd)
	}
	return done, nil
}

// flush writes what waits for d's dst.
func (c *LoopConn) flush(d *loopDir) (bool, error) {
	moved := false
	if d.inPipe > 0 {
		for d.inPipe > 0 {
			m, err := rawio.Splice(d.pipe.r, c.fds[d.dst], d.inPipe)
			if err == unix.EINTR {
				continue
			}
			if err == unix.EAGAIN {
				c.writable[d.dst] = false
				break
			}
			if err != nil {
				return moved, &WriteError{err}
			}
			d.inPipe -= int(m)
			moved = true
		}
		if d.inPipe == 0 && d.splicing && pipes.squeezing() {
			// Descriptors run short: a stream that never empties its
			// source would hold its pipe, which a client needs, for good.
			d.splicing, d.noPipe = false, true
		}
		if d.inPipe == 0 && !d.splicing {
			c.endSplicing(d)
		}
	} else {
		m, err := c.write(d, (*d.buf)[d.off:d.n])
		d.off += m // before the error: finish takes back d.n-d.off
		if err != nil {
			return false, &WriteError{err}
		}
		moved = m > 0
		if d.off == d.n {
			autoBufs.Put(d.buf)
			d.buf, d.off, d.n = nil, 0, 0
		}
	}
	if moved {
		d.lastActive = c.l.now
	}
	if d.pending() {
		if moved {
			d.stallSince = 0
		}
		c.stalled(d)
	} else {
		d.stallSince = 0
	}
	return moved, nil
}

// stalled notes that bytes wait for a full dst: the write bound counts
// from the last progress.
func (c *LoopConn) stalled(d *loopDir) {
	l := c.l
	if l.o.WriteTimeout <= 0 || d.stallSince != 0 {
		return
	}
	d.stallSince = l.now
	t := &c.timers[timerWriteUp]
	if d == &c.down {
		t = &c.timers[timerWriteDown]
	}
	if t.index < 0 {
		l.timers.set(t, mono.Add(l.now, l.o.WriteTimeout))
	}
}

func (c *LoopConn) startSplicing(d *loopDir) {
	if !d.hasPipe {
		pp, err := pipes.get()
		if err != nil {
			// No pipe (out of descriptors): stay buffered.
			d.noPipe, d.splicing = true, false
			return
		}
		d.pipe, d.hasPipe = pp, true
	}
	d.splicing = true
}

// endSplicing gives the pipe back once it is empty and the burst is over.
func (c *LoopConn) endSplicing(d *loopDir) {
	if d.hasPipe && d.inPipe == 0 && !d.splicing {
		pipes.put(d.pipe, true)
		d.hasPipe = false
	}
}

// other is the direction opposite d.
func (c *LoopConn) other(d *loopDir) *loopDir {
	if d == &c.down {
		return &c.up
	}
	return &c.down
}

// directionEnded bounds the other direction once the first ended.
func (c *LoopConn) directionEnded(d *loopDir) {
	l := c.l
	other := c.other(d)
	if !other.done && l.o.HalfCloseTimeout > 0 {
		other.lastActive = l.now
		l.timers.set(&c.timers[timerHalf], mono.Add(l.now, l.o.HalfCloseTimeout))
	}
}

// failed ends the connection after d failed, passing the end on as the
// goroutine relay does (whomToReset); a bound that ran out is abort's. A
// peer's reset reaches the other peer after what that peer sent before
// it (resetWhenSent).
func (c *LoopConn) failed(d *loopDir, err error) {
	resetSrc, resetDst := whomToReset(err, false)
	switch {
	case resetSrc && !resetDst:
		// d's peer reset while d wrote to it: what that peer sent before
		// its reset (an HTTP server's early answer to an upload it will
		// not read) waits unread on its socket, and a reset of d's
		// source now would drop it, where without a proxy it reaches
		// that client ahead of the reset.
		c.resetWhenSent(c.other(d))
		return
	case resetDst && !resetSrc:
		// d's source reset: what d read of it may still wait for d's
		// destination, in d or in that socket's queue.
		c.resetWhenSent(d)
		return
	}
	c.resetBoth()
}

// resetWhenSent passes the reset of d's source on to d's destination once
// what the source sent before its reset went out to it: d goes on moving
// it (a read after a reset returns the bytes queued ahead of it first),
// then the reset waits until the destination's socket has sent all it
// holds. A reset at once dropped what was still queued in that socket
// (SO_LINGER 0 discards it): an answer longer than the client's window
// was cut, where without a proxy the peer's kernel had sent it before its
// reset. The other direction stops. A destination that takes nothing is
// reset when salvageBound runs out (the loop's timer), and both sockets
// are closed then, as after any bound. A FIN of ours already sent to the
// destination (d done) ends it at once, as before: it is writable for
// good then, so nothing would tell when it is sent. Nothing of this runs
// while no peer resets.
func (c *LoopConn) resetWhenSent(d *loopDir) {
	if d.done || c.fds[d.src] < 0 || c.fds[d.dst] < 0 {
		c.resetBoth()
		return
	}
	l := c.l
	c.state, c.resetSide = stateDraining, d.dst
	for i := range c.timers {
		l.timers.stop(&c.timers[i])
	}
	// The dial's entry, long unused, is the bound's (timer: any timer
	// of a draining connection is it).
	l.timers.set(&c.timers[timerDial], mono.Add(l.now, salvageBound))
	// errHup: an end of file read now is the reset (its error taken by
	// the write that failed), checked as such (received), never passed on
	// as a FIN.
	c.readable[d.src], c.writable[d.dst], c.errHup[d.src] = true, true, true
	c.drain()
}

// drain runs one turn of a draining connection (stateDraining): it moves
// what the reset source still holds to the destination, as pump's turn,
// and once all is out of the proxy and the destination's socket has sent
// it, resets the destination and ends.
func (c *LoopConn) drain() {
	d := &c.down
	if c.resetSide == sideBackend {
		d = &c.up
	}
	start := d.count.Load()
	for range turnBudget {
		if c.fds[d.src] < 0 && !d.pending() {
			break
		}
		moved, err := c.step(d)
		if _, ok := err.(*WriteError); ok {
			c.abort() // the destination failed as well
			return
		}
		if err != nil || d.eof {
			// The source's reset (or the end of file it leaves once a
			// read took its error, never a FIN to pass on): all it sent
			// before it was read.
			d.eof, d.fin = false, false
			resetClose(c.fds[d.src])
			c.fds[d.src] = -1
			continue
		}
		if !moved {
			break
		}
		if d.count.Load()-start >= turnBytes {
			c.l.queue(c)
			return
		}
	}
	if c.fds[d.src] >= 0 || d.pending() {
		return // an event of either socket goes on
	}
	if sentAll(c.fds[d.dst]) {
		setLinger0(c.fds[d.dst])
		c.finish()
	}
}

// stop ends the connection as its loop stops: as abort, but a dial still
// pending fails with ErrLoopStopped. The proxy stopping is no endpoint's
// fault: the proxier counts and reports no failure for it.
func (c *LoopConn) stop() {
	if c.state == stateDialing {
		c.fail(ErrLoopStopped)
		return
	}
	c.abort()
}

// abort resets both peers (a bound ran out, a fault's reset, a draining
// connection's bound).
func (c *LoopConn) abort() {
	if c.state == stateClosed {
		return
	}
	if c.state == stateDialing {
		c.fail(ErrDialTimeout)
		return
	}
	c.resetBoth()
}

// resetBoth closes both sockets with a reset (SO_LINGER 0) and ends.
func (c *LoopConn) resetBoth() {
	setLinger0(c.fds[sideClient])
	setLinger0(c.fds[sideBackend])
	c.finish()
}

// finish closes both sockets and tells the handler.
func (c *LoopConn) finish() {
	for _, d := range []*loopDir{&c.up, &c.down} {
		// Counted when read; what never reached dst is taken back, so
		// Ended reports bytes delivered, as the goroutine relay does.
		if undelivered := d.n - d.off + d.inPipe; undelivered > 0 {
			d.count.Add(-int64(undelivered))
		}
		if d.buf != nil {
			autoBufs.Put(d.buf)
			d.buf = nil
		}
		if d.hasPipe {
			pipes.put(d.pipe, d.inPipe == 0)
			d.hasPipe = false
		}
	}
	for _, fd := range c.fds {
		if fd >= 0 {
			rawio.Close(fd)
		}
	}
	c.fds = [2]int{-1, -1}
	c.release()
	c.h.Ended(c.in.Load(), c.out.Load())
}

// release gives back the slot and the timers.
func (c *LoopConn) release() {
	c.state = stateClosed
	for i := range c.timers {
		c.l.timers.stop(&c.timers[i])
	}
	// The slot may be taken again at once, within this batch of events:
	// the closed sockets' events still in it carry their tags, which the
	// next connection's are not.
	c.l.conns[c.slot] = nil
	c.l.free = append(c.l.free, c.slot)
	c.l.held.Add(-1)
}

func setLinger0(fd int) {
	if fd >= 0 {
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	}
}

func resetClose(fd int) {
	if fd >= 0 {
		setLinger0(fd)
		rawio.Close(fd)
	}
}
