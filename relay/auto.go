package relay

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// autoBufSize is the small buffer a direction reads through first. A read
// that fills it means bulk data is queued, and the direction switches to
// splice; a splice that moves less than it switches back.
const autoBufSize = 16 << 10

var autoBufs = sync.Pool{New: func() any { b := make([]byte, autoBufSize); return &b }}

// Auto copies src to dst as Splice does, but moves small messages with
// read and write through a pooled 16 KiB buffer (HAProxy's splice-auto): a
// 64-byte request then costs one read and one write instead of two splices
// and a pipe taken from the pool. A read that fills the buffer hands the
// direction to splice until a splice moves less than a buffer again. Like
// Splice it holds no buffer or pipe while src is idle, waits through the
// runtime poller (deadlines on src apply) and reports a failure on dst as a
// *WriteError.
func Auto(dst, src *net.TCPConn) (int64, error) {
	a, err := newAutoCopier(dst, src)
	if err != nil {
		return 0, err
	}
	return a.run()
}

// autoCopier is one direction's state. Conn holds both directions by
// value, and one callback per direction serves every raw call (op says
// which), so a relayed connection costs few allocations and moving bytes
// none. Only tests observe it (observe): the hot path pays no atomics
// for them.
type autoCopier struct {
	// splice also holds the write bound both write paths share
	// (drain.stall): a direction writes one way at a time.
	splice   splicer
	splicing bool
	noPipe   bool // pipe2 failed once: stay buffered
	op       uint8
	// ackHeld: dst holds its handshake's ACK in delayed-ACK mode until
	// this direction's first write (Conn.BackendHoldsACK).
	ackHeld bool
	call    func(fd uintptr) bool

	// observe, if set (tests), is told of every change of mode and of
	// whether a buffer is held; nil costs a comparison.
	observe func(splicing, holding bool)

	buf     *[]byte // held only while src has data
	n       int
	readErr error
	// relayed counts the bytes the read callback wrote on itself (the
	// TCP_INQ path; a failure on dst there is readErr, a *WriteError);
	// writeNow is that write, built once (writeSome for dstRaw.Control).
	relayed  int64
	writeNow func(fd uintptr)

	written  int64
	writeErr error
}

// What the direction's callback runs (autoCopier.op).
const (
	opSplice uint8 = iota // the splicer's fill or drain
	opRead
	opWrite
)

// bind applies a write bound (nil: none) to both of the direction's write
// paths, which share it.
func (a *autoCopier) bind(b *writeBound) {
	a.splice.drain.stall = stall{bound: b, dst: a.splice.dst}
}

func newAutoCopier(dst, src *net.TCPConn) (*autoCopier, error) {
	srcRaw, err := src.SyscallConn()
	if err != nil {
		return nil, err
	}
	dstRaw, err := dst.SyscallConn()
	if err != nil {
		return nil, err
	}
	a := &autoCopier{}
	a.init(dst, srcRaw, dstRaw)
	return a, nil
}

// init readies a (zero) direction; the raw conns may be shared with the
// other direction.
func (a *autoCopier) init(dst *net.TCPConn, srcRaw, dstRaw syscall.RawConn) {
	a.splice.dst, a.splice.srcRaw, a.splice.dstRaw = dst, srcRaw, dstRaw
	a.call = a.callback
	a.splice.call = a.call
	a.writeNow = func(fd uintptr) { a.writeSome(fd) }
}

func (a *autoCopier) callback(fd uintptr) bool {
	switch a.op {
	case opRead:
		return a.read(fd)
	case opWrite:
		return a.write(fd)
	}
	return a.splice.callback(fd)
}

func (a *autoCopier) run() (int64, error) {
	defer a.release()
	var total int64
	for {
		if a.splicing {
			a.op = opSplice
			n, written, err := a.splice.cycle()
			total += written
			switch {
			case errors.Is(err, errNoPipe):
				a.splicing, a.noPipe = false, true
				continue
			case errors.Is(err, errUrgentMark):
				a.splicing = false // a read steps over the mark
				a.changed()
				continue
			case err != nil:
				return total, err
			case n == 0:
				return total, nil // EOF
			case n < autoBufSize:
				a.splicing = false // the burst is over
				a.changed()
			}
			continue
		}
		n, err := a.readOnce()
		total += a.relayed
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, nil // EOF
		}
		written, err := a.writeAll()
		total += int64(written)
		if err != nil {
			return total, writeFailed(err)
		}
		if n == autoBufSize && !a.noPipe {
			a.release()
			a.splicing = true
			a.changed()
		}
	}
}

// readOnce waits until src has bytes and reads what fits the buffer;
// 0 with no error is EOF. Messages that emptied src on the way were
// relayed already (a.relayed).
func (a *autoCopier) readOnce() (int, error) {
	a.n, a.readErr, a.op = 0, nil, opRead
	a.relayed = 0
	err := a.splice.srcRaw.Read(a.call)
	if err == nil {
		err = a.readErr
	}
	return a.n, err
}

// read is the read callback. Go's poller forgets readiness at the start of
// every raw read, so between two raw reads a direction must read until
// EAGAIN before it may wait: one system call per message that only says
// "nothing more". When the kernel's TCP_INQ hint (SocketControl sets the
// option) says a read emptied src — nothing queued and no FIN — the
// message is written to dst here, inside the raw read, which then reads
// on: that read is still made, as the hint counts no reset, and a reset
// queued behind the message raised no wake-up but the one this raw read
// consumed (the event loop, which sees the event's mask, skips it when
// the mask has no error or hang-up; Go's poller keeps none). That
// write goes through dst's
// descriptor held by Control, never waiting: nested inside the raw read,
// a raw write with its poller wait grew every relay goroutine's stack
// from 2 to 4 KiB (idle RSS 8.7 -> 12.9 KiB per connection). What a full
// socket does not take is left to run's writeAll, which waits under the
// write bound. Without a hint, with more queued, or with the buffer full
// (bulk: splice may take over), the read returns to run as before.
func (a *autoCopier) read(fd uintptr) bool {
	for {
		if a.buf == nil {
			a.buf = autoBufs.Get().(*[]byte)
			a.changed()
		}
		var inq int
		a.n, inq, a.readErr = rawio.RecvInq(int(fd), *a.buf)
		switch a.readErr {
		case nil:
		case unix.EINTR:
			// Retry here: returning false would wait in the edge-triggered
			// poller for bytes that may already be there.
			continue
		case unix.EAGAIN:
			// Nothing to read: give the buffer back while we wait, so an
			// idle connection holds none.
			a.release()
			a.readErr = nil
			return false
		default:
			a.n = 0
			return true
		}
		if a.n == 0 || inq != 0 || a.n == len(*a.buf) {
			return true // EOF, or run writes (and may splice)
		}
		a.written, a.writeErr = 0, nil
		err := a.splice.dstRaw.Control(a.writeNow)
		a.relayed += a.written
		if err == nil {
			err = a.writeErr
		}
		if err != nil {
			a.n, a.readErr = 0, &WriteError{err}
			return true
		}
		if a.written < int64(a.n) {
			// dst is full: run writes the rest, waiting for room.
			a.n = copy(*a.buf, (*a.buf)[a.written:a.n])
			return true
		}
		// Read on, to EAGAIN or a reset the hint does not count (read).
	}
}

// writeAll writes the n bytes the last read put in the buffer.
func (a *autoCopier) writeAll() (int, error) {
	a.written, a.writeErr, a.op = 0, nil, opWrite
	err := a.splice.drain.stall.write(a.splice.dstRaw, a.call, &a.written, &a.writeErr)
	return int(a.written), err
}

func (a *autoCopier) write(fd uintptr) bool {
	if a.writeSome(fd) {
		// Socket buffer full: wait until writable, after (re)arming the
		// write bound if there is one.
		return a.splice.drain.stall.leave(a.written)
	}
	return true
}

// writeSome writes what is left of the buffer's n bytes from a.written
// on, until done, a failure (a.writeErr), or a full socket (true).
func (a *autoCopier) writeSome(fd uintptr) (full bool) {
	full = a.send(fd)
	if a.ackHeld && a.written > 0 {
		a.ackHeld = false
		sendHandshakeACK(int(fd))
	}
	return full
}

func (a *autoCopier) send(fd uintptr) (full bool) {
	out := (*a.buf)[:a.n]
	for a.written < int64(len(out)) {
		m, err := rawio.Send(int(fd), out[a.written:])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return true
		case err != nil:
			a.writeErr = err
			return false
		case m == 0:
			a.writeErr = io.ErrUnexpectedEOF
			return false
		}
		a.written += int64(m)
	}
	return false
}

func (a *autoCopier) release() {
	if a.buf != nil {
		autoBufs.Put(a.buf)
		a.buf = nil
		a.changed()
	}
}

func (a *autoCopier) changed() {
	if a.observe != nil {
		a.observe(a.splicing, a.buf != nil)
	}
}
