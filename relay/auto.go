package relay

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
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

// autoCopier is one direction's state; its closures are built once per
// connection so that moving bytes allocates nothing.
type autoCopier struct {
	splice   *splicer
	splicing bool
	noPipe   bool // pipe2 failed once: stay buffered

	// observed mirrors splicing and whether a buffer is held, for tests
	// (written at mode changes only, never per byte).
	observed atomic.Uint32

	buf     *[]byte // held only while src has data
	n       int
	readErr error
	readFn  func(fd uintptr) bool

	out      []byte
	written  int64
	writeErr error
	writeFn  func(fd uintptr) bool
	stall    stall
}

// bind applies a write bound (nil: none) to both of the direction's write
// paths.
func (a *autoCopier) bind(b *writeBound) {
	a.stall = stall{bound: b, dst: a.splice.dst}
	a.splice.drain.stall = a.stall
}

func newAutoCopier(dst, src *net.TCPConn) (*autoCopier, error) {
	s, err := newSplicer(dst, src)
	if err != nil {
		return nil, err
	}
	a := &autoCopier{splice: s}
	a.readFn, a.writeFn = a.read, a.write
	return a, nil
}

func (a *autoCopier) run() (int64, error) {
	defer a.release()
	var total int64
	for {
		if a.splicing {
			n, written, err := a.splice.cycle()
			total += written
			switch {
			case errors.Is(err, errNoPipe):
				a.splicing, a.noPipe = false, true
				continue
			case err != nil:
				return total, err
			case n == 0:
				return total, nil // EOF
			case n < autoBufSize:
				a.splicing = false // the burst is over
				a.observe()
			}
			continue
		}
		n, err := a.readOnce()
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, nil // EOF
		}
		written, err := a.writeAll((*a.buf)[:n])
		total += int64(written)
		if err != nil {
			return total, &WriteError{err}
		}
		if n == autoBufSize && !a.noPipe {
			a.release()
			a.splicing = true
			a.observe()
		}
	}
}

// readOnce waits until src has bytes and reads what fits the buffer;
// 0 with no error is EOF.
func (a *autoCopier) readOnce() (int, error) {
	a.n, a.readErr = 0, nil
	err := a.splice.srcRaw.Read(a.readFn)
	if err == nil {
		err = a.readErr
	}
	return a.n, err
}

func (a *autoCopier) read(fd uintptr) bool {
	if a.buf == nil {
		a.buf = autoBufs.Get().(*[]byte)
		a.observe()
	}
	a.n, a.readErr = unix.Read(int(fd), *a.buf)
	for a.readErr == unix.EINTR {
		// Retry here: returning false would wait in the edge-triggered
		// poller for bytes that may already be there.
		a.n, a.readErr = unix.Read(int(fd), *a.buf)
	}
	switch a.readErr {
	case unix.EAGAIN:
		// Nothing to read: give the buffer back while we wait, so an
		// idle connection holds none.
		a.release()
		a.readErr = nil
		return false
	}
	if a.n < 0 {
		a.n = 0
	}
	return true
}

func (a *autoCopier) writeAll(p []byte) (int, error) {
	a.out, a.written, a.writeErr = p, 0, nil
	err := a.stall.write(a.splice.dstRaw, a.writeFn, &a.written, &a.writeErr)
	a.out = nil
	return int(a.written), err
}

func (a *autoCopier) write(fd uintptr) bool {
	for a.written < int64(len(a.out)) {
		m, err := unix.Write(int(fd), a.out[a.written:])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			// Socket buffer full: wait until writable, after (re)arming
			// the write bound if there is one.
			return a.stall.leave(a.written)
		case err != nil:
			a.writeErr = err
			return true
		case m == 0:
			a.writeErr = io.ErrUnexpectedEOF
			return true
		}
		a.written += int64(m)
	}
	return true
}

func (a *autoCopier) release() {
	if a.buf != nil {
		autoBufs.Put(a.buf)
		a.buf = nil
		a.observe()
	}
}

const (
	observedSplicing = 1 << iota
	observedBuffer
)

func (a *autoCopier) observe() {
	var v uint32
	if a.splicing {
		v |= observedSplicing
	}
	if a.buf != nil {
		v |= observedBuffer
	}
	a.observed.Store(v)
}
