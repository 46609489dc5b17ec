package relay

import (
	"io"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
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
type pipePool struct {
	mu   sync.Mutex
	free []pipePair
	max  int
}

var pipes = &pipePool{max: 256}

func (p *pipePool) get() (pipePair, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		pp := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return pp, nil
	}
	p.mu.Unlock()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return pipePair{}, err
	}
	_, _ = unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, spliceChunk)
	return pipePair{r: fds[0], w: fds[1]}, nil
}

// put returns an empty pipe; one that still holds bytes (after an error)
// is closed instead, since its contents belong to a dead connection.
func (p *pipePool) put(pp pipePair, empty bool) {
	p.mu.Lock()
	if empty && len(p.free) < p.max {
		p.free = append(p.free, pp)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
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
	srcRaw, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	dstRaw, err := dst.SyscallConn()
	if err != nil {
		return 0, err
	}
	// The closures are built once per connection, not per wake-up: the
	// loop below allocates nothing while bytes flow.
	var (
		total   int64
		pp      pipePair
		held    bool
		n       int64
		readErr error
	)
	fill := func(fd uintptr) bool {
		if !held {
			if pp, readErr = pipes.get(); readErr != nil {
				return true
			}
			held = true
		}
		n, readErr = unix.Splice(int(fd), nil, pp.w, nil, spliceChunk, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		switch readErr {
		case unix.EINTR:
			return false
		case unix.EAGAIN:
			// Nothing to read: give the pipe back while we wait.
			pipes.put(pp, true)
			held = false
			readErr = nil
			return false
		}
		return true
	}
	drain := &pipeDrainer{}
	for {
		held, n, readErr = false, 0, nil
		err := srcRaw.Read(fill)
		if err == nil {
			err = readErr
		}
		if err != nil || n == 0 {
			if held {
				pipes.put(pp, true)
			}
			if err == nil {
				return total, nil // EOF
			}
			if !held && isPipeShortage(err) {
				m, err := Copy(dst, src)
				return total + m, err
			}
			return total, err
		}
		written, werr := drain.run(dstRaw, pp, n)
		total += written
		pipes.put(pp, werr == nil)
		if werr != nil {
			return total, &WriteError{werr}
		}
	}
}

// pipeDrainer splices a pipe's bytes into a socket; one per connection
// direction, so its callback is allocated once.
type pipeDrainer struct {
	pp       pipePair
	n        int64
	written  int64
	err      error
	callback func(fd uintptr) bool
}

func (d *pipeDrainer) run(raw syscall.RawConn, pp pipePair, n int64) (int64, error) {
	if d.callback == nil {
		d.callback = d.write
	}
	d.pp, d.n, d.written, d.err = pp, n, 0, nil
	err := raw.Write(d.callback)
	if err == nil {
		err = d.err
	}
	return d.written, err
}

func (d *pipeDrainer) write(fd uintptr) bool {
	for d.written < d.n {
		m, err := unix.Splice(d.pp.r, nil, int(fd), nil, int(d.n-d.written), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false // socket buffer full: wait until writable
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
