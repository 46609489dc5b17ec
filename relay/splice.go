package relay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// spliceChunk is how much one splice moves at most: the pipe's size, set to
// the kernel's default pipe-max-size so bulk transfers need few calls.
const spliceChunk = 1 << 20

// pipePair is one kernel pipe used to splice socket to socket.
type pipePair struct {
	r, w int
}

// pipePool keeps idle pipes for reuse. Unlike (*TCPConn).ReadFrom, which
// holds a pipe for a connection's whole life (6 descriptors per proxied
// connection: the legacy proxier and a naive Go proxy hit the descriptor
// limit near 3,300 idle connections), we hold a pipe only while bytes move,
// so an idle connection costs its two sockets and nothing else.
//
// A pipe is only a speed-up, never worth a client: none is opened in the
// top eighth of the descriptors below the ceiling (nearCeiling), and once
// any connection's descriptor lands there the pool is squeezed: its idle
// pipes are closed, pipes given back are closed, and no new one is opened
// for idle, so connections go on through their buffers and the
// descriptors go to clients (pipes took up to a quarter of a 1,024 limit
// in a burst of streaming clients, and 83-115 of 400 were refused). Idle
// pipes are closed too once unused for idle (one timer for the pool, armed
// while pipes wait), so a burst's pipes do not stay pooled for good.
type pipePool struct {
	mu sync.Mutex
	// free is a stack, oldest use first: get takes the last one given
	// back, trimIdle closes from the front.
	free []idlePipe
	max  int
	idle time.Duration
	trim *time.Timer
	// armed: trim runs; squeezedUntil is when the squeeze ends
	// (mono.Now).
	armed         bool
	squeezedUntil atomic.Int64
}

type idlePipe struct {
	pipePair
	since int64 // given back then (mono.Now)
}

var pipes = &pipePool{max: 256, idle: pipeIdle}

// pipeIdle is how long a pooled pipe may wait unused, and how long a
// squeeze lasts.
const pipeIdle = 10 * time.Second

func (p *pipePool) get() (pipePair, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		pp := p.free[n-1].pipePair
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return pp, nil
	}
	p.mu.Unlock()
	if p.squeezed(mono.Now()) {
		return pipePair{}, unix.EMFILE // stay buffered, as when pipe2 finds no descriptor
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return pipePair{}, err
	}
	if nearCeiling(max(fds[0], fds[1])) {
		// Left to clients: a connection stays buffered, as when pipe2
		// finds no descriptor.
		unix.Close(fds[0])
		unix.Close(fds[1])
		p.squeeze()
		return pipePair{}, unix.EMFILE
	}
	_, _ = unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, spliceChunk)
	return pipePair{r: fds[0], w: fds[1]}, nil
}

// put returns an empty pipe; one that still holds bytes (after an error)
// is closed instead, since its contents belong to a dead connection, and
// so is one given back while the pool is squeezed or full.
func (p *pipePool) put(pp pipePair, empty bool) {
	now := mono.Now()
	p.mu.Lock()
	if empty && len(p.free) < p.max && !p.squeezed(now) {
		p.free = append(p.free, idlePipe{pp, now})
		if !p.armed {
			p.armed = true
			if p.trim == nil {
				p.trim = time.AfterFunc(p.idle, p.trimIdle)
			} else {
				p.trim.Reset(p.idle)
			}
		}
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	pp.close()
}

// trimIdle closes the pipes unused for idle, and looks again when the
// oldest left will have been.
func (p *pipePool) trimIdle() {
	now := mono.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for n < len(p.free) && now-p.free[n].since >= int64(p.idle) {
		p.free[n].close()
		n++
	}
	p.free = p.free[:copy(p.free, p.free[n:])]
	if len(p.free) == 0 {
		p.armed = false
		return
	}
	p.trim.Reset(time.Duration(p.free[0].since + int64(p.idle) - now))
}

// squeeze closes the idle pipes and keeps the pool from opening or
// keeping any for idle: a connection's descriptor came near the ceiling.
func (p *pipePool) squeeze() {
	now := mono.Now()
	was := p.squeezed(now)
	p.squeezedUntil.Store(now + int64(p.idle))
	if was {
		return // idle pipes closed already, none pooled since
	}
	p.mu.Lock()
	for _, pp := range p.free {
		pp.close()
	}
	p.free = p.free[:0]
	p.mu.Unlock()
}

// squeezed tells whether a squeeze lasts at now (mono.Now).
func (p *pipePool) squeezed(now int64) bool { return now < p.squeezedUntil.Load() }

// squeezing is squeezed now, with no clock read unless a squeeze began
// (a direction holding a pipe asks it per pipe emptied).
func (p *pipePool) squeezing() bool {
	until := p.squeezedUntil.Load()
	if until == 0 {
		return false
	}
	if mono.Now() < until {
		return true
	}
	p.squeezedUntil.CompareAndSwap(until, 0)
	return false
}

// unsqueeze ends a squeeze (a new ceiling).
func (p *pipePool) unsqueeze() { p.squeezedUntil.Store(0) }

func (pp pipePair) close() {
	unix.Close(pp.r)
	unix.Close(pp.w)
}

// Splice copies src to dst until EOF or an error, through a pooled pipe
// taken only once src has data. It waits for readability through the
// runtime poller (RawConn), so deadlines on src apply as with Read. When no
// pipe can be had (EMFILE from pipe2 on a busy node) it goes on with a
// buffered copy instead of ending a live connection. A failure on dst is a
// *WriteError.
func Splice(dst, src *net.TCPConn) (int64, error) {
	s, err := newSplicer(dst, src)
	if err != nil {
		return 0, err
	}
	var total int64
	for {
		n, written, err := s.cycle()
		total += written
		if errors.Is(err, errNoPipe) {
			m, err := Copy(dst, src)
			return total + m, err
		}
		if errors.Is(err, errUrgentMark) {
			bp := GetBuffer()
			m, err := copyOnce(dst, src, *bp)
			PutBuffer(bp)
			total += m
			if err == io.EOF {
				return total, nil
			}
			if err != nil {
				return total, err
			}
			continue
		}
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, nil // EOF
		}
	}
}

// errNoPipe wraps a pipe2 failure for want of descriptors or memory: the
// caller goes on without splicing.
var errNoPipe = errors.New("relay: no pipe for splice")

// errUrgentMark is a splice that stopped at an urgent (MSG_OOB) byte's
// mark: it moves nothing there, saying EAGAIN however much is queued behind
// the mark, or end of file once a FIN is queued too. Only a read steps over
// the mark (leaving out the urgent byte, which is not inline, as a
// read-based proxy does); the caller reads once and splices again.
var errUrgentMark = errors.New("relay: splice stopped at an urgent byte's mark")

// splicer is one direction's splice state. One callback serves both of
// its raw calls (fill and drain, told apart by draining) and is built once
// per direction, so moving bytes allocates nothing.
type splicer struct {
	dst            *net.TCPConn
	srcRaw, dstRaw syscall.RawConn
	pp             pipePair
	held           bool
	n              int64
	readErr        error
	draining       bool
	call           func(fd uintptr) bool
	drain          pipeDrainer
}

func newSplicer(dst, src *net.TCPConn) (*splicer, error) {
	srcRaw, err := src.SyscallConn()
	if err != nil {
		return nil, err
	}
	dstRaw, err := dst.SyscallConn()
	if err != nil {
		return nil, err
	}
	s := &splicer{dst: dst, srcRaw: srcRaw, dstRaw: dstRaw}
	s.call = s.callback
	return s, nil
}

func (s *splicer) callback(fd uintptr) bool {
	if s.draining {
		return s.drain.write(fd)
	}
	return s.fill(fd)
}

func (s *splicer) fill(fd uintptr) bool {
	if !s.held {
		if s.pp, s.readErr = pipes.get(); s.readErr != nil {
			return true
		}
		s.held = true
	}
	for {
		s.n, s.readErr = rawio.Splice(int(fd), s.pp.w, spliceChunk)
		if s.readErr != unix.EINTR {
			break
		}
		// Retry: returning false would wait in the edge-triggered poller
		// for bytes that may already be there.
	}
	if s.n == 0 && (s.readErr == nil || s.readErr == unix.EAGAIN) && rawio.AtMark(int(fd)) {
		// Not empty, nor ended: waiting would stall the stream for good,
		// a FIN passed on would lose what follows the mark.
		s.readErr = errUrgentMark
		return true
	}
	switch s.readErr {
	case unix.EAGAIN:
		// Nothing to read: give the pipe back while we wait.
		pipes.put(s.pp, true)
		s.held = false
		s.readErr = nil
		return false
	}
	return true
}

// cycle waits until src has bytes, splices what it has (up to a pipe) into
// dst, and says how many it read and wrote. read == 0 with no error is EOF;
// a failure on dst is a *WriteError; errNoPipe means no pipe could be had,
// errUrgentMark that a read must step over an urgent byte's mark.
func (s *splicer) cycle() (read, written int64, err error) {
	s.held, s.n, s.readErr, s.draining = false, 0, nil, false
	err = s.srcRaw.Read(s.call)
	if err == nil {
		err = s.readErr
	}
	if err != nil || s.n == 0 {
		if s.held {
			pipes.put(s.pp, true)
		}
		if err != nil && !s.held && isPipeShortage(err) {
			err = fmt.Errorf("%w: %w", errNoPipe, err)
		}
		return 0, 0, err
	}
	s.draining = true
	written, werr := s.drain.run(s.dstRaw, s.call, s.pp, s.n)
	pipes.put(s.pp, werr == nil)
	if werr != nil {
		return s.n, written, writeFailed(werr)
	}
	return s.n, written, nil
}

// pipeDrainer splices a pipe's bytes into a socket; one per connection
// direction. run is given the direction's callback, which calls write.
type pipeDrainer struct {
	stall   stall
	pp      pipePair
	n       int64
	written int64
	err     error
}

func (d *pipeDrainer) run(raw syscall.RawConn, call func(fd uintptr) bool, pp pipePair, n int64) (int64, error) {
	d.pp, d.n, d.written, d.err = pp, n, 0, nil
	err := d.stall.write(raw, call, &d.written, &d.err)
	return d.written, err
}

func (d *pipeDrainer) write(fd uintptr) bool {
	for d.written < d.n {
		m, err := rawio.Splice(d.pp.r, int(fd), int(d.n-d.written))
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			// Socket buffer full: wait until writable, after (re)arming
			// the write bound if there is one.
			return d.stall.leave(d.written)
		case err != nil:
			d.err = err
			return true
		case m == 0:
			d.err = io.ErrUnexpectedEOF
			return true
		}
		d.written += m
	}
	return true
}

// isPipeShortage reports a pipe2 failure for want of descriptors or memory.
func isPipeShortage(err error) bool {
	return err == unix.EMFILE || err == unix.ENFILE || err == unix.ENOMEM
}
