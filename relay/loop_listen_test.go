package relay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// takingAcceptor takes every client for itself (closing it) and counts them.
type takingAcceptor struct{ accepted atomic.Int32 }

func (a *takingAcceptor) Accepted(fd int, _ netip.AddrPort) Handler {
	// Counted before the close: the client's EOF is a test's cue to read
	// the count (counted after, a loaded runner read 3 of 4).
	a.accepted.Add(1)
	unix.Close(fd)
	return nil
}
func (a *takingAcceptor) AcceptFailed(error)            {}
func (a *takingAcceptor) Refused(netip.AddrPort, error) {}

// loopListening is a loop (not running) with one listener on loopback.
func loopListening(t *testing.T, acc Acceptor) (*Loop, *loopListener, netip.AddrPort) {
	t.Helper()
	l, err := newLoop(LoopOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	fd := dupListener(t, ln.(*net.TCPListener))
	t.Cleanup(func() { unix.Close(fd) })
	l.now = l.clock()
	l.listen(&Listener{fd: fd, acc: acc, regs: make([]*loopListener, 1)})
	return l, l.listeners[0], addr
}

func dialOnce(t *testing.T, addr netip.AddrPort) {
	t.Helper()
	c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
}

// A listener paused for want of descriptors comes back when its pause ends
// even if the loop never runs out of work (and so never parks): here 128
// always-readable eventfds fill every poll.
func TestLoopResumesPausedListenerWhileBusy(t *testing.T) {
	acc := &takingAcceptor{}
	l, ll, addr := loopListening(t, acc)
	l.pause(ll) // as accept does on EMFILE
	for range len(l.events) {
		efd, err := unix.Eventfd(1, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(efd) })
		// Level-triggered and never read (the loop reads its own
		// eventfd for this slot): ready at every poll.
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: evSlot}
		if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, efd, &ev); err != nil {
			t.Fatal(err)
		}
	}
	go l.run()
	t.Cleanup(func() {
		l.post(loopCmd{op: cmdStop})
		<-l.done
	})
	dialOnce(t, addr)
	deadline := time.Now().Add(2 * time.Second)
	for acc.accepted.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a listener paused for %v was still out of the busy loop's epoll set after 2 s", ll.backoff)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A client taken ends the accept back-off: the next shortage pauses for the
// shortest time again, though the backlog never ran empty (no EAGAIN).
func TestLoopAcceptResetsBackoff(t *testing.T) {
	acc := &takingAcceptor{}
	l, ll, addr := loopListening(t, acc)
	t.Cleanup(l.shutdown)
	for range acceptBatch + 1 {
		dialOnce(t, addr) // connected: in the backlog
	}
	ll.backoff = time.Second // as after a series of shortages
	l.accept(ll.slot)
	if got := acc.accepted.Load(); got != acceptBatch {
		t.Fatalf("one accept turn took %d clients, want %d", got, acceptBatch)
	}
	if ll.backoff != 0 {
		t.Fatalf("back-off after accepted clients: %v, want 0", ll.backoff)
	}
}

func TestClientGone(t *testing.T) {
	for _, tc := range []struct {
		err  error
		gone bool
	}{
		{unix.ECONNABORTED, true},
		{unix.EPROTO, true},
		{unix.ENETDOWN, true},
		{unix.ENOPROTOOPT, true},
		{unix.EHOSTDOWN, true},
		{unix.ENONET, true},
		{unix.EHOSTUNREACH, true},
		{unix.EOPNOTSUPP, true},
		{unix.ENETUNREACH, true},
		{unix.EMFILE, false},
		{unix.ENFILE, false},
		{unix.ENOBUFS, false},
		{unix.ENOMEM, false},
		{unix.EBADF, false},
		{&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", unix.ENETUNREACH)}, true},
		{&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", unix.EMFILE)}, false},
		{net.ErrClosed, false},
	} {
		if got := ClientGone(tc.err); got != tc.gone {
			t.Errorf("ClientGone(%v) = %v, want %v", tc.err, got, tc.gone)
		}
	}
	// The loops ask it of every accept's outcome, nil included.
	for _, err := range []error{nil, unix.EMFILE, unix.ECONNABORTED} {
		if n := testing.AllocsPerRun(100, func() { ClientGone(err) }); n != 0 {
			t.Errorf("ClientGone(%v) allocates %v times", err, n)
		}
	}
}

// A post to a stopped loop writes nothing, even when the loop's eventfd
// number is taken by another descriptor since.
func TestLoopPostAfterStopWritesNothing(t *testing.T) {
	l, err := newLoop(LoopOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go l.run()
	l.post(loopCmd{op: cmdStop})
	<-l.done
	// New descriptors take the lowest free numbers: open eventfds until
	// one has the old eventfd's number (skip if another took it first).
	reused := -1
	for reused < 0 {
		fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		switch {
		case fd == l.evfd:
			reused = fd
		case fd > l.evfd:
			t.Skipf("descriptor %d was taken again before the test could take it", l.evfd)
		}
	}
	l.sleeping.Store(true) // as a poster that checked before the loop stopped saw it
	l.post(loopCmd{op: cmdQuiet})
	if n, err := unix.Read(reused, make([]byte, 8)); n > 0 {
		t.Fatalf("a post to a stopped loop wrote into the descriptor that took its eventfd's number")
	} else if err != unix.EAGAIN {
		t.Fatalf("reading the eventfd: %v", err)
	}
}

// recordingAcceptor takes every client (closing it) and keeps the errors.
type recordingAcceptor struct {
	takingAcceptor
	errs []error
}

func (a *recordingAcceptor) AcceptFailed(err error) { a.errs = append(a.errs, err) }

// A listener epoll refuses to take back when its pause ends stays paused
// and is tried again later, rather than left out of the set for good.
func TestLoopRetriesListenerItCouldNotResume(t *testing.T) {
	acc := &recordingAcceptor{}
	l, ll, addr := loopListening(t, acc)
	t.Cleanup(l.shutdown)
	l.pause(ll)
	// epoll refuses a regular file (EPERM): stands in for a full epoll
	// (ENOSPC at fs.epoll.max_user_watches) or ENOMEM.
	f, err := os.CreateTemp(t.TempDir(), "not-pollable")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sock := ll.ln.fd
	ll.ln.fd = int(f.Fd())
	l.now = ll.resume
	next := l.resumeListeners()
	ll.ln.fd = sock
	if len(acc.errs) != 1 || acc.errs[0] != unix.EPERM {
		t.Fatalf("errors reported: %v, want [EPERM]", acc.errs)
	}
	if !ll.paused || l.paused != 1 || next <= l.now || next != ll.resume {
		t.Fatalf("after a failed resume: paused %v (loop counts %d), next resume %d at %d (listener's %d); want paused again, later",
			ll.paused, l.paused, next, l.now, ll.resume)
	}
	// The next try succeeds: the listener serves again.
	l.now = next
	if l.resumeListeners() != 0 || ll.paused || l.paused != 0 {
		t.Fatalf("second resume: paused %v (loop counts %d)", ll.paused, l.paused)
	}
	dialOnce(t, addr)
	var events [4]unix.EpollEvent
	deadline := time.Now().Add(2 * time.Second)
	for {
		n, err := unix.EpollWait(l.epfd, events[:], 10)
		if err != nil && err != unix.EINTR {
			t.Fatal(err)
		}
		if n > 0 && events[0].Pad == listenerTag {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the resumed listener never reported a client")
		}
	}
}

// The same when epoll refuses a new listener: it waits paused for another try.
func TestLoopRetriesListenerItCouldNotAdd(t *testing.T) {
	l, err := newLoop(LoopOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.shutdown)
	f, err := os.CreateTemp(t.TempDir(), "not-pollable")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	acc := &recordingAcceptor{}
	ln := &Listener{fd: int(f.Fd()), acc: acc, regs: make([]*loopListener, 1)}
	l.now = l.clock()
	l.listen(ln)
	ll := ln.regs[0]
	if len(acc.errs) != 1 || !ll.paused || l.paused != 1 || l.resumeAt != ll.resume || ll.resume <= l.now {
		t.Fatalf("errors %v, paused %v (loop counts %d), resume at %d (loop's %d) from %d; want one error, paused, resuming later",
			acc.errs, ll.paused, l.paused, ll.resume, l.resumeAt, l.now)
	}
	l.unlisten(ln)
	if l.paused != 0 {
		t.Fatalf("loop counts %d paused after unlisten", l.paused)
	}
}

// listenNumbered is a listening socket bound to a port by number (Refuse
// needs one: the kernel lets go of a port it chose once the socket stops
// listening).
func listenNumbered(t *testing.T) (int, netip.AddrPort) {
	t.Helper()
	fd, at, err := ListenTCP(netip.MustParseAddrPort("127.0.0.1:0"), false, Liveness{})
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	fd, at, err = ListenTCP(at, false, Liveness{})
	if err != nil {
		t.Fatal(err)
	}
	return fd, at
}

// dialOutcome is a connect to addr and a read: "served" when the acceptor
// took it (it closes the client: EOF), else the error.
func dialOutcome(t *testing.T, addr netip.AddrPort) error {
	t.Helper()
	c, err := net.DialTimeout("tcp4", addr.String(), 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = c.Read(make([]byte, 1))
	return err
}

// A refusing listener's port refuses connects (ECONNREFUSED, as a closed
// port's) and stays the listener's: Resume serves it again, on every loop,
// and an idle loop does not spin on the socket meanwhile.
func TestListenerRefuseResume(t *testing.T) {
	g, err := NewGroup(2, LoopOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	acc := &takingAcceptor{}
	fd, addr := listenNumbered(t)
	ln := g.Listen(fd, acc)
	t.Cleanup(func() { ln.Close() })
	served := func(round string) {
		t.Helper()
		before := acc.accepted.Load()
		for range 4 {
			if err := dialOutcome(t, addr); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("%s: connect served with %v", round, err)
			}
		}
		if n := acc.accepted.Load() - before; n != 4 {
			t.Fatalf("%s: %d of 4 clients accepted", round, n)
		}
	}
	served("before Refuse")
	for round := range 3 {
		if err := ln.Refuse(); err != nil {
			t.Fatal(err)
		}
		if err := ln.Refuse(); err != nil { // twice: nothing more
			t.Fatal(err)
		}
		before := acc.accepted.Load()
		if err := dialOutcome(t, addr); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("round %d: connect while refusing: %v, want ECONNREFUSED", round, err)
		}
		if acc.accepted.Load() != before {
			t.Fatalf("round %d: a client was accepted while refusing", round)
		}
		// The port is still bound: a socket without SO_REUSEADDR
		// cannot have it.
		other, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		err = unix.Bind(other, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()})
		unix.Close(other)
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("round %d: binding the refusing listener's port: %v, want EADDRINUSE", round, err)
		}
		if err := ln.Resume(); err != nil {
			t.Fatalf("round %d: Resume: %v", round, err)
		}
		served(fmt.Sprintf("round %d after Resume", round))
	}
	if err := ln.Refuse(); err != nil {
		t.Fatal(err)
	}
	if err := ln.Close(); err != nil {
		t.Fatalf("Close of a refusing listener: %v", err)
	}
	if err := ln.Resume(); err != nil {
		t.Fatalf("Resume after Close: %v", err)
	}
}

// orderingAcceptor numbers its clients as they reach Accepted, after a
// pause that lets another loop accept meanwhile, and asks for the kernel's
// order (OrderedAcceptor).
type orderingAcceptor struct {
	mu    sync.Mutex
	order []uint16 // the clients' ports, in the order numbered
	all   chan struct{}
	n     int
}

func (a *orderingAcceptor) InOrder() bool { return true }
func (a *orderingAcceptor) Accepted(fd int, from netip.AddrPort) Handler {
	time.Sleep(50 * time.Microsecond) // the window between accept4 and the number
	a.mu.Lock()
	a.order = append(a.order, from.Port())
	if len(a.order) == a.n {
		close(a.all)
	}
	a.mu.Unlock()
	unix.Close(fd)
	return nil
}
func (a *orderingAcceptor) AcceptFailed(error)            {}
func (a *orderingAcceptor) Refused(netip.AddrPort, error) {}

// Clients queued one after another reach an OrderedAcceptor in that order,
// although several loops accept from the shared socket: fault draws are
// numbered there, and README promises "same seed and arrival order → same
// faults".
func TestLoopsKeepAcceptOrderForOrderedAcceptor(t *testing.T) {
	const n = 300
	g, err := NewGroup(4, LoopOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	fd := listeningSocket(t)
	if err := unix.Listen(fd, n); err != nil { // the whole pool queues
		t.Fatal(err)
	}
	acc := &orderingAcceptor{n: n, all: make(chan struct{})}
	ln := g.Listen(fd, acc)
	defer ln.Close()
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(netip.AddrFrom4(sa.(*unix.SockaddrInet4).Addr), uint16(sa.(*unix.SockaddrInet4).Port))
	dialed := make([]uint16, n)
	for i := range dialed {
		c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(addr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		dialed[i] = uint16(c.LocalAddr().(*net.TCPAddr).Port)
	}
	select {
	case <-acc.all:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d clients accepted", len(acc.order), n)
	}
	acc.mu.Lock()
	defer acc.mu.Unlock()
	moved := 0
	for i := range dialed {
		if acc.order[i] != dialed[i] {
			moved++
		}
	}
	if moved > 0 {
		t.Errorf("%d of %d clients numbered out of the order they were queued in", moved, n)
	}
}
