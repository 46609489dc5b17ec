package relay

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// Counter receives the bytes a direction moved (a prometheus.Counter fits).
type Counter interface{ Add(float64) }

// Copier moves one direction's bytes from src to dst until src ends. It
// returns nil when src sent a FIN (TCP then half-closes dst), or an error:
// a *WriteError for a failure on dst, ErrReset or ErrCut for an end the
// copier chose (a fault), anything else for a failure reading src. A
// Copier must not close either connection; TCP does.
type Copier func(dst, src *net.TCPConn) (int64, error)

// ErrReset asks TCP to abort both connections with a reset (SO_LINGER 0).
var ErrReset = errors.New("relay: reset requested")

// ErrCut asks TCP to end the copier's direction as a peer that hung up
// would: its destination gets a FIN and is read no more. The other
// direction's source is that socket: its read then fails with
// os.ErrDeadlineExceeded, which TCP takes as that source's FIN (a Copier
// may return the error or nil), so the other direction closes its own way
// (a Copier's slow close) before its destination's FIN, as Toxiproxy's
// other link reads the end of the connection a toxic closed.
var ErrCut = errors.New("relay: cut requested")

// WriteError marks a failure on the destination side, so the peer that
// did not fail is the one reset.
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return "write: " + e.Err.Error() }
func (e *WriteError) Unwrap() error { return e.Err }

// Options are one connection's settings. The zero value copies both ways
// with Auto (small messages buffered, bulk spliced), no bounds, and counts
// nothing.
type Options struct {
	// HalfCloseTimeout bounds the inactivity of the direction still
	// running after the other ended with a FIN: nothing received from its
	// source, nothing taken by its destination; 0 = no bound.
	HalfCloseTimeout time.Duration
	// WriteTimeout bounds how long a direction may be unable to hand its
	// destination a single byte (the peer reads nothing, its window stays
	// closed): then both peers get a reset; 0 = no bound. It costs nothing
	// while writes go through: the deadline is armed only when the socket
	// is full. It applies to the built-in copies (nil Upstream/Downstream);
	// a Copier bounds its own writes (the faults' pipelines are given it).
	WriteTimeout time.Duration
	// In counts client→backend bytes, Out backend→client; nil = not counted.
	In, Out Counter
	// Upstream moves client→backend, Downstream backend→client; nil = Auto.
	Upstream, Downstream Copier
	// Quiet is how long both directions must be silent before a
	// CloseWhenQuiet request ends the connection; 0 = DefaultQuiet.
	Quiet time.Duration
	// CloseDeadline bounds the wait for that quiet moment: a connection
	// still busy this long after its CloseWhenQuiet came due is closed
	// anyway (CloseWhenQuiet says how); 0 = wait for quiet however long.
	CloseDeadline time.Duration
	// OnAbort is called when the relay resets the connection itself (a
	// bound ran out), before the past deadlines that wake the copies are
	// set: a Copier that sets deadlines of its own (the faults' delays)
	// must not wait on over that abort.
	OnAbort func()
}

// How a connection is being ended by the relay itself (conn.ending).
const (
	endNone     int32 = iota
	endQuiet          // the client gets a FIN at a quiet moment (CloseWhenQuiet)
	endDeadline       // both peers get a FIN: CloseWhenQuiet's deadline came first
	endAbort          // both peers reset: a bound ran out
)

// forceBuffered keeps the built-in copy buffered, as when no pipe can be
// had (tests of that path's write bound).
var forceBuffered = false

// Conn is one relayed connection: New prepares it, Run relays.
type Conn struct {
	client, backend *net.TCPConn
	o               Options
	// ending is set before the deadlines that wake the copies, so a copy
	// that wakes (or re-arms a deadline) knows why.
	ending atomic.Int32
	// ended counts the directions that ended with a FIN; half bounds the
	// one still running after the first did (set by that first one, read
	// by Run once both returned). Beside ending: two 4-byte fields apart
	// padded Conn out of its size class (TestConnSize).
	ended atomic.Int32
	// bound is both directions' write bound (part of conn: no allocation).
	bound writeBound
	half  *halfClosed
	// finSent: a FIN of ours went to the client ([0]) or the backend
	// ([1]); set before the shutdown, read by resetUnderneath.
	finSent [2]atomic.Bool
	// cutFrom: the direction reading the client ([0]) or the backend
	// ([1]) is ended by the other's cut (ErrCut): a read deadline on it
	// is its source's FIN. Set before that deadline.
	cutFrom [2]atomic.Bool

	// up and down are the built-in copy's directions (client→backend,
	// backend→client), part of conn; rawErr is why they cannot run.
	up, down autoCopier
	rawErr   error
	wg       sync.WaitGroup

	// quiet serves CloseWhenQuiet, built at its first call (nil: none).
	quietMu sync.Mutex
	quiet   *quietCloser
}

// TCP relays client↔backend until both directions are done, then closes
// both. A FIN is passed on as a half-close; the other direction then has
// HalfCloseTimeout to finish, so a peer that never closes cannot pin the
// goroutines forever (the legacy leak, kubernetes#18354). A reset on one
// side resets the other; so does every other abnormal end (a timeout, a
// dead peer found by keep-alive), so no peer mistakes it for a clean end.
func TCP(client, backend *net.TCPConn, o Options) { New(client, backend, o).Run() }

// New prepares the relay of client↔backend; it owns both from now on.
func New(client, backend *net.TCPConn, o Options) *Conn {
	c := &Conn{client: client, backend: backend, o: o}
	c.bound = writeBound{timeout: o.WriteTimeout, conn: c}
	return c
}

// BackendHoldsACK says the backend was dialled with DialControl: the
// built-in client→backend copy's first write takes its socket out of the
// delayed-ACK mode that held the handshake's ACK (handshake_ack.go). Call
// before Run. (Not an Options field: one more word would put Conn in the
// next size class, TestConnSize.)
func (c *Conn) BackendHoldsACK() { c.up.ackHeld = true }

// Run relays until both directions are done, then closes both sockets.
func (c *Conn) Run() {
	if c.o.Upstream == nil || c.o.Downstream == nil {
		c.rawErr = c.initAuto()
	}
	c.wg.Add(1)
	go c.upstream()
	c.copyHalf(c.client, c.backend, c.o.Downstream, c.o.Out, &c.down)
	c.wg.Wait()
	c.quietMu.Lock()
	if c.quiet != nil {
		c.quiet.stop()
	}
	c.quietMu.Unlock()
	c.half.stop()
	c.client.Close()
	c.backend.Close()
}

func (c *Conn) upstream() {
	defer c.wg.Done()
	c.copyHalf(c.backend, c.client, c.o.Upstream, c.o.In, &c.up)
}

// initAuto readies both built-in directions, which share the sockets'
// raw conns.
func (c *Conn) initAuto() error {
	clientRaw, err := c.client.SyscallConn()
	if err != nil {
		return err
	}
	backendRaw, err := c.backend.SyscallConn()
	if err != nil {
		return err
	}
	c.up.init(c.backend, clientRaw, backendRaw)
	c.down.init(c.client, backendRaw, clientRaw)
	return nil
}

// CloseWhenQuiet ends the connection at its first quiet moment (both
// directions silent for Options.Quiet, nothing in flight) at least d from
// now, so no request is cut mid-flight: the client gets a FIN, as from a
// server closing an idle keep-alive connection, and its pool reconnects;
// the backend gets its FIN once the client closed. One still not quiet
// Options.CloseDeadline after that is closed anyway, the same way but on
// both sides at once: what was read is delivered, then each peer gets a
// FIN (a request in progress is cut). The earliest request wins; a
// connection that ends first costs one timer. Safe from any goroutine,
// before or during Run.
func (c *Conn) CloseWhenQuiet(d time.Duration) {
	c.quietMu.Lock()
	if c.quiet == nil {
		quiet := c.o.Quiet
		if quiet <= 0 {
			quiet = DefaultQuiet
		}
		c.quiet = &quietCloser{clk: clock.RealClock{}, quiet: quiet, deadline: c.o.CloseDeadline,
			state: c.quietState, close: c.endQuietly}
	}
	q := c.quiet
	c.quietMu.Unlock()
	q.closeAt(q.clk.Now().Add(d))
}

func (c *Conn) quietState() (client, backend sockQuiet, ok bool) {
	client, ok = socketQuiet(c.client)
	if !ok {
		return
	}
	backend, ok = socketQuiet(c.backend)
	return
}

// endQuietly stops the backend→client direction as if the backend had
// sent a FIN: a read deadline in the past wakes its read, and copyHalf
// passes a FIN on to the client. Forced (the deadline came before a quiet
// moment), the client→backend direction stops so too: the connection
// ends even if its client, uploading, never reads the FIN.
func (c *Conn) endQuietly(forced bool) {
	past := time.Unix(1, 0)
	if !forced {
		if c.ending.CompareAndSwap(endNone, endQuiet) {
			_ = c.backend.SetReadDeadline(past)
		}
		return
	}
	if c.ending.CompareAndSwap(endNone, endDeadline) {
		_ = c.backend.SetReadDeadline(past)
		_ = c.client.SetReadDeadline(past)
	}
}

// endsAsFIN tells whether a read of src that hit its deadline is
// CloseWhenQuiet's end of it.
func (c *Conn) endsAsFIN(src *net.TCPConn) bool {
	switch c.ending.Load() {
	case endQuiet:
		return src == c.backend
	case endDeadline:
		return true
	}
	return false
}

// QuietEnd tells, once Run returned, whether CloseWhenQuiet ended the
// connection, and how.
func (c *Conn) QuietEnd() QuietEnd {
	switch c.ending.Load() {
	case endQuiet:
		return ClosedQuiet
	case endDeadline:
		return ClosedAtDeadline
	}
	return NotClosed
}

// abort wakes both copies with a deadline in the past; they end with a
// reset to both peers.
func (c *Conn) abort() {
	c.ending.Store(endAbort)
	if c.o.OnAbort != nil {
		c.o.OnAbort()
	}
	past := time.Unix(1, 0)
	_ = c.client.SetDeadline(past)
	_ = c.backend.SetDeadline(past)
}

// copyHalf is a named function so goroutine dumps say what a stuck
// goroutine was doing.
func (c *Conn) copyHalf(dst, src *net.TCPConn, copier Copier, bytes Counter, a *autoCopier) {
	var n int64
	var err error
	switch {
	case copier == nil:
		if err = c.rawErr; err == nil {
			a.bind(&c.bound)
			a.noPipe = forceBuffered
			n, err = a.run()
		}
	default:
		n, err = copier(dst, src)
	}
	if bytes != nil {
		bytes.Add(float64(n))
	}
	if err != nil && c.endsAsFIN(src) && errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil // CloseWhenQuiet: end this direction as with a FIN
	}
	if err != nil && c.cutEnds(src, err) {
		err = nil // the other direction's cut ended src
	}
	if errors.Is(err, ErrCut) {
		c.cut(dst, src)
		return
	}
	if err != nil {
		switch {
		case errors.Is(err, net.ErrClosed):
			// The other direction ended first and closed both; it has
			// decided how the peers learn of the end.
			return
		default:
			resetSrc, resetDst := whomToReset(err, c.aborted())
			if resetSrc && !resetDst && c.ended.Load() == 0 && c.ending.Load() == endNone {
				// dst reset while this direction wrote to it: what dst's
				// peer sent before its reset (an HTTP server's early
				// answer to an upload it will not read) is still to be
				// read by the other direction, which passes it on to src
				// and then the reset (a read returns the queued bytes,
				// then the reset or, its error taken by this write, an
				// end of file that endOf finds a reset). Closing both now
				// dropped it, where without a proxy it reaches the client
				// ahead of the reset. A src that takes nothing does not
				// hold the end past salvageBound.
				_ = src.SetLinger(0)
				time.AfterFunc(salvageBound, func() {
					dst.Close()
					src.Close()
				})
				return
			}
			if resetDst && !resetSrc {
				// src reset: passed on to dst once what went before it
				// left dst's socket.
				c.resetWhenSent(dst, a)
				src.Close()
				return
			}
			if resetSrc {
				_ = src.SetLinger(0)
			}
			if resetDst {
				_ = dst.SetLinger(0)
			}
		}
		// Tear both down so the other copy returns too.
		dst.Close()
		src.Close()
		return
	}
	var srcRaw syscall.RawConn // the built-in copy's, when it ran
	if copier == nil && c.rawErr == nil {
		srcRaw = a.splice.srcRaw
	}
	switch c.endOf(src, srcRaw) {
	case srcReset:
		// src was reset, not closed: the other direction, writing to it,
		// took the error (a socket reports it once) and this read saw an
		// end of file. Passed on as a FIN, a reset reached its peer as a
		// clean end first (13 of 300 uploads to a backend that reset).
		c.resetWhenSent(dst, a)
		src.Close()
		return
	case srcClosed:
		// The other direction ended first and closed both; it has
		// decided how the peers learn of the end.
		return
	}
	c.finSent[c.sideOf(dst)].Store(true)
	if copier == nil && c.rawErr == nil {
		_ = a.splice.dstRaw.Control(func(fd uintptr) { _ = rawio.ShutdownWrite(int(fd)) })
	} else {
		_ = dst.CloseWrite()
	}
	// Only the first direction to end leaves the other running to bound.
	if c.ended.Add(1) > 1 {
		// Wake the first one's awaitReset on this socket.
		_ = dst.SetReadDeadline(time.Unix(1, 0))
		return
	}
	if c.o.HalfCloseTimeout > 0 {
		c.half = watchHalfClosed(c, dst, src)
	}
	c.awaitReset(src, dst, srcRaw)
}

// awaitReset waits, in the goroutine of the direction that ended first
// with a FIN, for src to be reset (a peer that half-closed and then
// aborted), and passes the reset on to dst: nothing reads src any more,
// and the direction still running, waiting on dst, learnt of it only
// when its half-close bound ran out, the sockets held till then. The
// wait is the runtime poller's (a reset wakes it; it costs nothing per
// byte); it ends when the other direction ends too (which closes both
// sockets or, with a FIN, sets a past read deadline on src) or an abort
// or CloseWhenQuiet sets one. raw is src's raw conn if one is at hand.
func (c *Conn) awaitReset(src, dst *net.TCPConn, raw syscall.RawConn) {
	if raw == nil {
		var err error
		if raw, err = src.SyscallConn(); err != nil {
			return
		}
	}
	side := c.sideOf(src)
	reset := false
	_ = raw.Read(func(fd uintptr) bool {
		if c.finSent[side].Load() {
			return true // the other direction ended with a FIN too
		}
		// CLOSE with no FIN of ours sent on src is a reset (endOf).
		reset = rawio.TCPState(int(fd)) == rawio.TCPClose && !c.finSent[side].Load()
		return reset
	})
	if reset {
		_ = dst.SetLinger(0)
		dst.Close()
		src.Close()
	}
}

// resetWhenSent passes a peer's reset on to dst once dst's socket has
// sent what it holds: what the peer sent before its reset, which this
// direction has written to dst. A reset at once (SO_LINGER 0) dropped
// what was still queued in the socket: an answer longer than the
// client's window was cut, where without a proxy the peer's kernel had
// sent it before its reset. The wait is the runtime poller's (sentAll
// arms the wake-up), bounded by salvageBound (a write deadline), and cut
// short by an abort (its past deadline) or by the other direction's
// timer after a write that met the reset (it closes both). A socket a FIN
// of ours went to is reset at once: writable for good, it gives no edge.
// a is this direction's built-in copy (its raw conn of dst, if it ran).
func (c *Conn) resetWhenSent(dst *net.TCPConn, a *autoCopier) {
	_ = dst.SetLinger(0)
	if !c.finSent[c.sideOf(dst)].Load() {
		var raw syscall.RawConn
		if a.splice.dstRaw != nil {
			raw = a.splice.dstRaw
		} else if r, err := dst.SyscallConn(); err == nil {
			raw = r
		}
		// Armed, then checked: an abort's past deadline set meanwhile
		// would be overwritten (as writeBound.arm does).
		if raw != nil && dst.SetWriteDeadline(time.Now().Add(salvageBound)) == nil && !c.aborted() {
			_ = raw.Write(func(fd uintptr) bool { return sentAll(int(fd)) })
		}
	}
	dst.Close()
}

func (c *Conn) aborted() bool { return c.ending.Load() == endAbort }

// cut ends a direction whose fault cut it (ErrCut) as a peer that hung up:
// dst gets a FIN, and the other direction, reading dst, meets a deadline
// that ends its source as a FIN, so it runs its own close (slow_close)
// before its peer's FIN. It counts as a direction ended: the half-close
// bound then covers the other direction, as after a peer's FIN. Closing
// both at once here skipped the other direction's close.
func (c *Conn) cut(dst, src *net.TCPConn) {
	c.cutFrom[c.sideOf(dst)].Store(true)
	c.finSent[c.sideOf(dst)].Store(true)
	_ = dst.CloseWrite()
	_ = dst.SetReadDeadline(time.Unix(1, 0))
	if c.ended.Add(1) == 1 && c.o.HalfCloseTimeout > 0 {
		c.half = watchHalfClosed(c, dst, src)
	}
}

// cutEnds tells whether err, a direction's failure reading src, is the
// end the other direction's cut gave src: its deadline, unless the relay
// is aborting (a bound's deadline) or the failure is a write's.
func (c *Conn) cutEnds(src *net.TCPConn, err error) bool {
	var we *WriteError
	return c.cutFrom[c.sideOf(src)].Load() && !c.aborted() &&
		errors.Is(err, os.ErrDeadlineExceeded) && !errors.As(err, &we)
}

// How src ended, for a read that saw an end of file (endOf).
const (
	srcFIN    = iota // the peer's FIN
	srcReset         // a reset the other direction's write took
	srcClosed        // the other direction closed both sockets already
)

// endOf tells how src, whose read just saw an end of file, ended: a FIN
// leaves it in CLOSE_WAIT (or, once ours went too, LAST_ACK and then
// CLOSE), a reset in CLOSE. So CLOSE means a reset only while no FIN of
// ours went out on it, read after the state: our FIN is recorded before
// it is sent. raw is src's raw conn if one is at hand (nil: asked for).
// Once a FIN of ours went out the answer is a FIN, without a look.
func (c *Conn) endOf(src *net.TCPConn, raw syscall.RawConn) int {
	side := c.sideOf(src)
	if c.finSent[side].Load() {
		return srcFIN
	}
	if raw == nil {
		var err error
		if raw, err = src.SyscallConn(); err != nil {
			return srcClosed
		}
	}
	state := -1
	if raw.Control(func(fd uintptr) { state = rawio.TCPState(int(fd)) }) != nil {
		return srcClosed
	}
	if state == rawio.TCPClose && !c.finSent[side].Load() {
		return srcReset
	}
	return srcFIN
}

// sideOf is conn's index in finSent.
func (c *Conn) sideOf(conn *net.TCPConn) int {
	if conn == c.client {
		return 0
	}
	return 1
}

// resetBehindStall is the reset of the source of the direction writing
// to dst, found while that write waits (stall): nobody reads the source
// then (the direction's own goroutine is its only reader), so its reset
// waited behind the write, for the write bound or, with none, for ever
// (a client giving up on an upload its backend stopped reading). Its
// error is that socket's (SO_ERROR, which takes it), ECONNRESET if it
// was taken already; nil while the source is not in CLOSE, or a FIN of
// ours went to it (it reaches CLOSE without a reset too: endOf).
func (c *Conn) resetBehindStall(dst *net.TCPConn) error {
	src, srcRaw := c.client, c.up.splice.srcRaw
	if dst == c.client {
		src, srcRaw = c.backend, c.down.splice.srcRaw
	}
	side := c.sideOf(src)
	if c.finSent[side].Load() || srcRaw == nil {
		return nil
	}
	var err error
	_ = srcRaw.Control(func(fd uintptr) {
		if rawio.TCPState(int(fd)) != rawio.TCPClose {
			return
		}
		if err = rawio.SocketError(int(fd)); err == nil {
			err = syscall.ECONNRESET
		}
	})
	if err == nil || c.finSent[side].Load() { // our FIN is recorded before it is sent
		return nil
	}
	return &sourceError{err}
}

// sourceError is a failure of a direction's source that its write found
// (resetBehindStall): the direction ends as when a read of the source
// fails, not with a *WriteError (writeFailed).
type sourceError struct{ err error }

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// writeFailed is how a built-in copy's failed write ends its direction:
// a *WriteError, or the source's own failure the write found.
func writeFailed(err error) error {
	if se, ok := err.(*sourceError); ok {
		return se
	}
	return &WriteError{err}
}

// salvageBound is how long the goroutine relay lets a direction pass on
// what a peer sent before it reset, once the other direction's write met
// that reset (copyHalf).
const salvageBound = time.Second

// resetPoll is how often a built-in copy whose write makes no progress
// looks whether its source was reset meanwhile (resetBehindStall): a
// timer wake-up and a getsockopt per direction and look, only while the
// destination takes nothing (a flowing write re-arms its deadline before
// it fires, as the write bound always did). So such a reset reaches the
// other peer within resetPoll + salvageBound.
const resetPoll = salvageBound / 4

// whomToReset is how a direction's failure err is passed on, for both data
// paths: a reset from one peer is passed on to the other (the side that
// did not send it); a fault's reset, a bound that ran out (aborted), a
// dead peer (keep-alive or user timeout: ETIMEDOUT) or a local error
// resets both, so neither peer mistakes the end for a complete stream.
func whomToReset(err error, aborted bool) (src, dst bool) {
	if isReset(err) && !aborted {
		var we *WriteError
		if errors.As(err, &we) {
			return true, false
		}
		return false, true
	}
	return true, true
}

// isReset reports a reset from a peer (or a write to one that reset). A
// wake-up by abort can surface as EPIPE too; abort decides then.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// writeBound bounds how long a write may make no progress, and has a
// write that makes none look at its source every resetPoll.
type writeBound struct {
	timeout time.Duration // 0: no bound, only the looks
	// conn tells whether the relay is ending the connection: a copy must
	// not re-arm (or clear) a deadline over the one abort set.
	conn *Conn
}

// arm sets dst's deadline to the next look at the source, or to the
// bound's end, left from now, if that comes first (left 0: none).
func (b *writeBound) arm(dst *net.TCPConn, left time.Duration) error {
	wait := resetPoll
	if left > 0 {
		wait = min(wait, left)
	}
	_ = dst.SetWriteDeadline(time.Now().Add(wait))
	if b.conn.aborted() {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// disarm clears it once the write went through.
func (b *writeBound) disarm(dst *net.TCPConn) error {
	_ = dst.SetWriteDeadline(time.Time{})
	if b.conn.aborted() {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// stall applies a write bound to one write path: the deadline is set only
// when the socket is full, and again each time bytes went in since, so it
// measures time without progress; a write that never waits pays nothing.
// Its deadline also wakes the write every resetPoll to look at the
// source (resetBehindStall).
type stall struct {
	bound *writeBound // nil: no bound, no looks (Auto, Splice)
	dst   *net.TCPConn
	// armed: the deadline is set, counting from when the write had put
	// armedAt bytes in, at armedMs (mono.Now in ms, wrapping: uint32
	// fits beside the flags, and Conn holds two stalls, TestConnSize);
	// full: the callback left raw.Write to (re)arm it.
	armed, full bool
	armedMs     uint32
	armedAt     int64
}

func monoMs() uint32 { return uint32(mono.Now() / int64(time.Millisecond)) }

// look is the wake-up of a write that made no progress since it was
// armed: the source's reset, if one came (a *sourceError); the deadline
// error err once the bound ran out; nil after arming the next look.
func (s *stall) look(err error) error {
	c := s.bound.conn
	if c.aborted() {
		return err
	}
	if reset := c.resetBehindStall(s.dst); reset != nil {
		return reset
	}
	var left time.Duration
	if s.bound.timeout > 0 {
		if left = s.bound.timeout - time.Duration(monoMs()-s.armedMs)*time.Millisecond; left <= 0 {
			return err
		}
	}
	return s.bound.arm(s.dst, left)
}

// leave is a write callback's answer to EAGAIN with written bytes in so
// far: true (leave raw.Write, so write re-arms the bound) when there is a
// bound not armed since the last progress; false (wait in the poller).
func (s *stall) leave(written int64) bool {
	if s.bound != nil && (!s.armed || written > s.armedAt) {
		s.full = true
		return true
	}
	return false
}

// write runs raw.Write(fn) to the end of the callback's write, re-arming
// the bound whenever fn leaves for it; written and cbErr are the
// callback's progress and error.
func (s *stall) write(raw syscall.RawConn, fn func(fd uintptr) bool, written *int64, cbErr *error) error {
	for {
		s.full = false
		err := raw.Write(fn)
		if err == nil {
			err = *cbErr
		}
		if err == nil && s.full {
			s.armed, s.armedAt, s.armedMs = true, *written, monoMs()
			if err = s.bound.arm(s.dst, s.bound.timeout); err == nil {
				continue
			}
		}
		if s.armed && errors.Is(err, os.ErrDeadlineExceeded) {
			if err = s.look(err); err == nil {
				continue
			}
		}
		if err == nil && s.armed {
			s.armed = false
			err = s.bound.disarm(s.dst)
		}
		return err
	}
}
