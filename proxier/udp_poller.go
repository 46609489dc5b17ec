package proxier

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// udpPoller lets one goroutine wait on every backend socket of a service
// port: an epoll set whose own descriptor sits in Go's netpoller, so waiting
// parks the goroutine rather than an OS thread, and the idle timer is the
// file's read deadline. A goroutine per session cost 8-128 KiB of stack.
type udpPoller struct {
	epfd   int
	file   *os.File
	raw    syscall.RawConn
	events []unix.EpollEvent // owned by the waiting goroutine
	// n and waitFn are wait's result and poller callback, built once: a
	// closure made per wait was an allocation per wake-up. readyFn is
	// ready's, likewise (one per passed deadline).
	n       int
	waitFn  func(fd uintptr) bool
	readyFn func(fd uintptr)
}

// pollerBatch is how many ready sockets one wake-up reports.
const pollerBatch = 128

func newUDPPoller() (*udpPoller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	// Non-blocking, so os.NewFile registers it with the netpoller.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("epoll set non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(epfd), "udp-sessions")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	p := &udpPoller{epfd: epfd, file: f, raw: raw, events: make([]unix.EpollEvent, pollerBatch)}
	p.waitFn = p.poll
	p.readyFn = p.pollNow
	return p, nil
}

// add watches fd for datagrams (level-triggered: what one wake-up leaves
// unread is reported again). A closed descriptor leaves the set by itself.
// Callers serialise add with close.
func (p *udpPoller) add(fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	return rawio.EpollAdd(p.epfd, fd, &ev)
}

// wait blocks until some sockets are readable (or in error) and returns
// them in p.events[:n] (n may be 0: look again). It returns os.ErrDeadlineExceeded when the deadline
// passes first and an error wrapping os.ErrClosed after close.
func (p *udpPoller) wait() (int, error) {
	p.n = 0
	err := p.raw.Read(p.waitFn)
	return p.n, err
}

func (p *udpPoller) poll(fd uintptr) bool {
	var err error
	p.n, err = unix.EpollWait(int(fd), p.events, 0)
	if err != nil {
		p.n = 0 // EINTR: the caller looks again rather than sleep on events it did not see
		return true
	}
	return p.n > 0
}

// ready is wait without blocking and without the deadline: the sockets
// readable now (n may be 0).
func (p *udpPoller) ready() int {
	p.n = 0
	_ = p.raw.Control(p.readyFn)
	return p.n
}

func (p *udpPoller) pollNow(fd uintptr) {
	var err error
	if p.n, err = unix.EpollWait(int(fd), p.events, 0); err != nil {
		p.n = 0
	}
}

// setDeadline makes wait return at t; the zero time means never.
func (p *udpPoller) setDeadline(t time.Time) { _ = p.file.SetReadDeadline(t) }

func (p *udpPoller) close() error { return p.file.Close() }
