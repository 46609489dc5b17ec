package relay

import (
	"errors"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// Acceptor is the caller's side of a listening socket on a loop Group. Its
// methods run on a loop's goroutine and must not block.
type Acceptor interface {
	// Accepted is a new client (a non-blocking socket): the Handler of its
	// connection, or nil when the caller took the socket for itself.
	Accepted(fd int, from netip.AddrPort) Handler
	// Refused reports a client refused at once (reset) because its
	// descriptor fell in the reserve (ErrDescriptorReserve).
	Refused(from netip.AddrPort, err error)
	// AcceptFailed reports an accept error; on running out of descriptors
	// or memory the loop pauses this socket a while (backing off).
	AcceptFailed(err error)
}

// ResetClose refuses a client whose socket an Acceptor took (Accepted
// returning nil) as the loops refuse one in the reserve: closed with a
// reset.
func ResetClose(fd int) { resetClose(fd) }

// OrderedAcceptor is an Acceptor whose clients may have to reach Accepted
// in the order the kernel queued them (the fault draws number them there).
// The loops share the socket, so two of them race between accept4 and
// Accepted; while InOrder is true, a loop holds the listener's order lock
// from its accept4 until Accepted returns, so Accepted sees the clients
// one at a time in the queue's order. InOrder is asked before every
// accept and must be cheap; while it is false an accept costs that call
// and no lock.
type OrderedAcceptor interface {
	Acceptor
	InOrder() bool
}

// Listener is a listening socket served by every loop of a Group: it sits in
// every loop's epoll set, and the loop that accepts a client relays it, so
// no hand-off between goroutines (unless that loop holds more connections
// than another by more than a little: loop_balance.go). EPOLLEXCLUSIVE does not hold the other
// loops back here: the kernel ends an exclusive wake-up only at a thread
// waiting in epoll_wait on that very set, and a loop's set is waited on
// through the netpoller's own epoll, so a client arriving while the loops
// are parked wakes each of them, and the losers find the client taken.
// Measured on loopback with 2 loops, one client at a time: 5.3 context
// switches and 200 us of CPU per connection; with the socket in one loop's
// set, handing clients to another only when it carried 2 fewer, 2.9 and 164
// us — but 8 % more CPU at 4 clients at a time and 4 % more at 32 (each
// hand-off to a parked loop is a wake-up too, and one loop does every
// accept), so the shared socket stays. Under load the loops are awake and
// the race costs at most an accept that says EAGAIN. With many loops (a big
// node) each loop is woken per client at low load; one socket per loop
// (SO_REUSEPORT) would wake one loop, at a descriptor per loop for every
// service port, and any process of the same user could join the group and
// take a share of the clients (a second proxy given the same port range
// would, where today its bind fails). The flag stays for a loop that would
// wait on its set itself.
type Listener struct {
	g   *Group
	fd  int
	acc Acceptor
	// ordered is acc when it is an OrderedAcceptor (nil: never in order);
	// orderMu is held from accept4 to Accepted while it asks for order.
	ordered OrderedAcceptor
	orderMu sync.Mutex
	// inherited: the listening socket has TCP_NODELAY, which every socket
	// it accepts inherits (else each accepted one is given it).
	inherited bool
	// regs holds each loop's registration, by the loop's index; only that
	// loop reads or writes its element. So unlisten finds its slot at
	// once: a scan of the loop's listeners made closing every port of a
	// big node quadratic (10,000 ports: 0.66 s).
	regs []*loopListener

	// mu orders Refuse, Resume and Close; refusing: Refuse's state.
	mu               sync.Mutex
	refusing, closed bool
	closeOnce        sync.Once
}

// listenerTag marks a listener's epoll events (Fd: its slot in the loop).
const listenerTag = -2

// acceptBatch is how many clients a loop accepts per wake-up before it
// serves its connections again (the socket is level-triggered).
const acceptBatch = 32

// Listen serves the listening socket fd (non-blocking; the Group owns it
// from now on: Close closes it).
func (g *Group) Listen(fd int, acc Acceptor) *Listener {
	ln := &Listener{g: g, fd: fd, acc: acc, regs: make([]*loopListener, len(g.loops))}
	ln.ordered, _ = acc.(OrderedAcceptor)
	ln.inherited = rawio.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1) == nil
	for _, l := range g.loops {
		l.post(loopCmd{op: cmdListen, ln: ln})
	}
	return ln
}

// Close stops accepting on every loop, then closes the socket; a port it
// held is free when Close returns. Connections accepted stay.
func (ln *Listener) Close() error {
	var err error
	ln.closeOnce.Do(func() {
		ln.mu.Lock()
		defer ln.mu.Unlock()
		ln.unlistenAll()
		err = unix.Close(ln.fd)
		ln.closed = true
	})
	return err
}

// unlistenAll takes the socket out of every loop's set. Every loop is
// asked first, then waited for: they unlisten side by side.
func (ln *Listener) unlistenAll() {
	done := make([]chan struct{}, len(ln.g.loops))
	for i, l := range ln.g.loops {
		done[i] = make(chan struct{})
		l.post(loopCmd{op: cmdUnlisten, ln: ln, done: done[i]})
	}
	for i, l := range ln.g.loops {
		select {
		case <-done[i]:
		case <-l.done: // the loop stopped: it holds nothing
		}
	}
}

// Refuse stops listening until Resume: the socket leaves the loops' sets
// and then listening (StopListening); its port must have been bound by
// number. Connections accepted stay.
func (ln *Listener) Refuse() error {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.closed || ln.refusing {
		return nil
	}
	// Out of the sets first: a socket that no longer listens is always
	// ready (EPOLLHUP), so every loop would be woken to fail an accept on
	// it (EINVAL) and count an error, again after each back-off.
	ln.unlistenAll()
	ln.refusing = true
	return StopListening(ln.fd)
}

// Resume listens again after Refuse (ListenAgain). On an error the
// listener stays refusing; Resume may be called again.
func (ln *Listener) Resume() error {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.closed || !ln.refusing {
		return nil
	}
	if err := ListenAgain(ln.fd); err != nil {
		return err
	}
	ln.refusing = false
	for _, l := range ln.g.loops {
		l.post(loopCmd{op: cmdListen, ln: ln})
	}
	return nil
}

// loopListener is one loop's registration of a Listener.
type loopListener struct {
	ln   *Listener
	slot int32 // in the loop's listeners
	// paused: the socket left this loop's epoll set until resume (a
	// temporary accept error), backoff is the current pause.
	paused  bool
	resume  int64
	backoff time.Duration
}

func (l *Loop) listen(ln *Listener) {
	var slot int32
	if n := len(l.freeListeners); n > 0 {
		slot = l.freeListeners[n-1]
		l.freeListeners = l.freeListeners[:n-1]
	} else {
		slot = int32(len(l.listeners))
		l.listeners = append(l.listeners, nil)
	}
	ll := &loopListener{ln: ln, slot: slot}
	l.listeners[slot] = ll
	ln.regs[l.index] = ll
	if err := l.watchListener(ll, slot); err != nil {
		ln.acc.AcceptFailed(err)
		l.pause(ll) // added when the pause ends (resumeListeners)
	}
}

func (l *Loop) watchListener(ll *loopListener, slot int32) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: slot, Pad: listenerTag}
	return unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, ll.ln.fd, &ev)
}

func (l *Loop) unlisten(ln *Listener) {
	ll := ln.regs[l.index]
	if ll == nil {
		return
	}
	ln.regs[l.index] = nil
	if ll.paused {
		l.paused--
	} else {
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, ln.fd, nil)
	}
	l.listeners[ll.slot] = nil
	l.freeListeners = append(l.freeListeners, ll.slot)
}

// accept takes the clients queued on a listener.
func (l *Loop) accept(slot int32) {
	ll := l.listeners[slot]
	if ll == nil || ll.paused {
		return
	}
	ln := ll.ln
	for range acceptBatch {
		inOrder := ln.ordered != nil && ln.ordered.InOrder()
		if inOrder {
			ln.orderMu.Lock()
		}
		more := l.acceptOne(ll)
		if inOrder {
			ln.orderMu.Unlock()
		}
		if !more {
			return
		}
	}
}

// acceptOne takes one client (or one error); false: stop accepting on
// this listener for now.
func (l *Loop) acceptOne(ll *loopListener) bool {
	fd, from, err := rawio.Accept4(ll.ln.fd)
	switch {
	case err == unix.EAGAIN:
		ll.backoff = 0
		return false
	case err == unix.EINTR:
		return true
	case ClientGone(err):
		ll.ln.acc.AcceptFailed(err) // that client is gone; the next
		return true
	case err != nil:
		ll.ln.acc.AcceptFailed(err)
		l.pause(ll)
		return false
	}
	if InReserve(fd) {
		// Refused, not left in the backlog to hang: the clients
		// queued behind it are refused alike until descriptors free.
		ll.ln.acc.Refused(from, ErrDescriptorReserve) // before the client can see it
		resetClose(fd)
		return true
	}
	// A client taken: the descriptors are back, so the next shortage
	// starts its back-off afresh (under load the backlog may never
	// run empty to say so with EAGAIN).
	ll.backoff = 0
	// What net sets on every accepted socket (the rest is inherited
	// from the listener, and this too where the listener took it).
	if !ll.ln.inherited {
		_ = rawio.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	}
	if h := ll.ln.acc.Accepted(fd, from); h != nil {
		l.place(ll.ln.g, fd, h)
	}
	return true
}

// ClientGone reports an accept error that belongs to one client, not to
// the listener: the connection was aborted, or (Linux passes a pending
// network error of the new socket on from accept, see accept(2)) its
// network failed. The next client may be fine, so accepting goes on.
func ClientGone(err error) bool {
	if en, ok := err.(unix.Errno); ok { // the loops' accept: no search, no allocation
		return clientErrno(en)
	}
	if err == nil {
		return false
	}
	var en unix.Errno
	return errors.As(err, &en) && clientErrno(en)
}

func clientErrno(en unix.Errno) bool {
	switch en {
	case unix.ECONNABORTED, unix.EPROTO, unix.ENETDOWN, unix.ENOPROTOOPT, unix.EHOSTDOWN,
		unix.ENONET, unix.EHOSTUNREACH, unix.EOPNOTSUPP, unix.ENETUNREACH:
		return true
	}
	return false
}

// pause takes a listener out of the loop's epoll set a while (out of
// descriptors: its clients wait in the backlog rather than spin the loop).
func (l *Loop) pause(ll *loopListener) {
	if ll.backoff == 0 {
		ll.backoff = 5 * time.Millisecond
	} else {
		ll.backoff = min(2*ll.backoff, time.Second)
	}
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, ll.ln.fd, nil)
	ll.paused, ll.resume = true, mono.Add(l.now, ll.backoff)
	if l.paused == 0 || ll.resume < l.resumeAt {
		l.resumeAt = ll.resume
	}
	l.paused++
}

// resumeListeners puts paused listeners whose pause is over back; it
// returns when the next pause ends (0: none paused).
func (l *Loop) resumeListeners() int64 {
	next := int64(0)
	for slot, ll := range l.listeners {
		if ll == nil || !ll.paused {
			continue
		}
		if ll.resume <= l.now {
			ll.paused = false
			l.paused--
			err := l.watchListener(ll, int32(slot))
			if err == nil {
				continue
			}
			// Out of the set, it would never be accepted on again: it
			// stays paused and tries again after a longer pause.
			ll.ln.acc.AcceptFailed(err)
			l.pause(ll)
		}
		if next == 0 || ll.resume < next {
			next = ll.resume
		}
	}
	return next
}
