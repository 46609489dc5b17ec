package relay

import (
	"errors"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// The event-loop data path (--data-path=eventloop). A Loop is one
// goroutine that owns an epoll set and every connection handed to it: it
// dials the backend (non-blocking connect, per-attempt timeouts, the next
// endpoint on failure), then moves bytes both ways on readiness. An idle
// connection costs its two sockets and a few hundred bytes of heap, no
// goroutine and no stack; a new one costs no goroutine, no runtime poller
// registration and none of net's address read-backs. Bounds (write,
// half-close, close-when-quiet, dial) are entries in the loop's timer heap.
//
// What the goroutine relay (Conn) offers and this path does not: plugged
// Copiers (faults) and deadlines set from outside. The caller keeps faulted
// connections on the goroutine relay.

// LoopOptions are every connection's settings on a loop Group.
type LoopOptions struct {
	// DialTimeouts bounds each dial attempt; its length is the number of
	// attempts (each may go to another endpoint: Handler.Backend).
	DialTimeouts []time.Duration
	// HalfCloseTimeout, WriteTimeout, Quiet and CloseDeadline as in
	// Options.
	HalfCloseTimeout, WriteTimeout, Quiet, CloseDeadline time.Duration
	// Liveness is applied to dialled sockets once they have relayed a
	// moment (Liveness.settle); accepted ones inherit the listener's.
	Liveness Liveness
}

// Handler is the caller's side of one connection on a loop. Its methods run
// on the loop's goroutine, in this order: Backend and DialFailed per
// attempt, then Connected and Ended, or Failed alone. They must not block.
type Handler interface {
	// Backend is the endpoint of attempt (0, 1, ...); an error ends the
	// connection (Failed with that error).
	Backend(attempt int) (netip.AddrPort, error)
	// DialFailed reports an attempt's failure; the next attempt follows.
	DialFailed(ep netip.AddrPort, err error)
	// Failed: no backend answered (err: the last failure), the loop
	// stopped (ErrLoopStopped) or the client reset first (ErrClientGone);
	// the client got a reset, both sockets are closed.
	Failed(err error)
	// Connected: ep answered and c relays from now on.
	Connected(c *LoopConn, ep netip.AddrPort)
	// Ended: both sockets are closed; in went client→backend, out back.
	Ended(in, out int64)
}

// ErrDialTimeout is a dial attempt that ran out of its time.
var ErrDialTimeout = errors.New("relay: dial timed out")

// Group is a set of loops; connections are spread over them in turn.
type Group struct {
	loops []*Loop
}

// NewGroup starts n loops (at least 1).
func NewGroup(n int, o LoopOptions) (*Group, error) {
	g := &Group{}
	for range max(n, 1) {
		l, err := newLoop(o)
		if err != nil {
			g.Close()
			return nil, err
		}
		l.index = len(g.loops)
		g.loops = append(g.loops, l)
		go l.run()
	}
	return g, nil
}

// Close stops the loops; their connections are reset and closed.
func (g *Group) Close() {
	for _, l := range g.loops {
		l.post(loopCmd{op: cmdStop})
		<-l.done
	}
}

// Commands a loop takes from other goroutines.
const (
	cmdListen uint8 = iota
	cmdUnlisten
	cmdQuiet
	cmdReset
	cmdStop
	cmdAdopt
)

type loopCmd struct {
	op   uint8
	ln   *Listener
	done chan struct{}
	c    *LoopConn
	at   int64
	// cmdAdopt: a client another loop accepted, and its handler.
	fd int
	h  Handler
}

// Loop is one event loop (see the comment at the top of this file).
type Loop struct {
	o          LoopOptions
	epfd, evfd int
	base       time.Time
	now        int64 // ns since base, updated at each wake-up

	mu       sync.Mutex
	inbox    []loopCmd
	closed   bool      // under mu: evfd is closed (the loop stopped)
	spare    []loopCmd // the inbox's other buffer, the loop's
	sleeping atomic.Bool

	// conns is the slot table: epoll events carry a slot, not a pointer
	// (the collector does not see the kernel's copy).
	conns  []*LoopConn
	free   []int32
	ready  []*LoopConn // connections with work left after their turn
	timers timerHeap
	tagSeq uint32
	// listeners by slot (nil: free, and then in freeListeners); paused
	// counts those out of the epoll set for a while.
	listeners     []*loopListener
	freeListeners []int32
	paused        int
	resumeAt      int64 // when the first pause ends (no later), while paused > 0
	// index is the loop's place in its Group (a Listener's regs).
	index int
	// held counts the connections in conns and those handed to this loop
	// and not yet adopted: what a loop that accepts compares (balance.go).
	held atomic.Int32

	// liveAfter is when a connection's backend socket gets the liveness
	// options (Liveness.settle; 0: none to set).
	liveAfter time.Duration

	scratch []byte
	events  [128]unix.EpollEvent
	stop    bool
	done    chan struct{}

	// The epoll set waits in Go's netpoller, not in a blocking
	// epoll_wait: a goroutine parked in the netpoller costs no thread
	// hand-off, while a thread blocked in a system call made sysmon
	// retake its P every 20 us (2.7 context switches per new connection
	// against 0.85 for HAProxy). The next timer is the file's read
	// deadline: deadlineAt (0: none) is the one set, moved only earlier
	// (waking early only re-arms it).
	file       *os.File
	raw        syscall.RawConn
	serveFn    func(fd uintptr) bool
	deadlineAt int64
}

// evSlot is the epoll data of the loop's eventfd.
const evSlot = -1

func newLoop(o LoopOptions) (*Loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	// Non-blocking, so os.NewFile registers it with the netpoller.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, err
	}
	file := os.NewFile(uintptr(epfd), "relay-loop")
	raw, err := file.SyscallConn()
	if err != nil {
		file.Close()
		return nil, err
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		file.Close()
		return nil, err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: evSlot}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		file.Close()
		unix.Close(evfd)
		return nil, err
	}
	if o.Quiet <= 0 {
		o.Quiet = DefaultQuiet
	}
	if len(o.DialTimeouts) == 0 {
		o.DialTimeouts = []time.Duration{time.Second}
	}
	l := &Loop{o: o, epfd: epfd, evfd: evfd, base: time.Now(), scratch: make([]byte, autoBufSize),
		done: make(chan struct{}), file: file, raw: raw}
	l.serveFn = l.serve
	if o.Liveness.Enabled() {
		l.liveAfter = o.Liveness.settle()
	}
	return l, nil
}

// post queues a command and wakes the loop if it sleeps; false: the loop
// has stopped and will run no more commands. The wake-up is written under
// mu, which shutdown holds to close the eventfd: a poster that lost the
// processor between its check and its write would otherwise write into
// whatever took the descriptor's number after the loop stopped.
func (l *Loop) post(cmd loopCmd) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.inbox = append(l.inbox, cmd)
	if l.sleeping.Load() && l.sleeping.CompareAndSwap(true, false) {
		l.wake()
	}
	return true
}

func (l *Loop) wake() {
	one := uint64(1)
	// A write to a non-blocking eventfd never waits: no scheduler hand-off
	// (rawio). A sync opening 10,000 ports wakes the loops that often.
	_, _ = rawio.Write(l.evfd, (*[8]byte)(unsafe.Pointer(&one))[:])
}

func (l *Loop) clock() int64 { return int64(time.Since(l.base)) }

func (l *Loop) run() {
	defer l.shutdown()
	for !l.stop {
		// The loop runs inside the read: serve returns false only to
		// park until the epoll set is readable, and Read returns only
		// when the loop stops or the timer deadline passes.
		err := l.raw.Read(l.serveFn)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			// A passed deadline fails every later read until it is reset.
			_ = l.file.SetReadDeadline(time.Time{})
			l.deadlineAt = 0
		case err != nil && !l.stop:
			panic("relay: waiting on the loop's epoll set: " + err.Error())
		}
	}
}

// serve is the netpoller's callback: it serves the loop's sockets, timers
// and commands until there is nothing left to do, then returns false to
// park (true: the loop stops). It parks without one more empty poll
// whenever it can: every readiness change of a socket in the set after a
// poll reaches the netpoller as a new edge of the set's descriptor, which
// the runtime keeps for this read until it parks, so only what the last
// poll left behind needs looking at: more events than fit in one call, and
// level-triggered listeners, which epoll re-queues without an edge.
func (l *Loop) serve(fd uintptr) bool {
	for {
		if l.sleeping.Load() {
			l.sleeping.Store(false) // awake: posters need not wake it
		}
		l.now = l.clock()
		if l.takeInbox(); l.stop {
			return true
		}
		l.runReady()
		l.fireTimers()
		if l.paused > 0 && l.now >= l.resumeAt {
			// Here, not only when parking: a loop that never runs out of
			// work never parks, and a listener paused for want of
			// descriptors would stay out of its set for as long as the
			// load lasts.
			l.resumeAt = l.resumeListeners()
		}
		n := rawio.EpollPoll(int(fd), l.events[:])
		l.now = l.clock()
		again := n == len(l.events)
		for i := range n {
			ev := &l.events[i]
			switch {
			case ev.Fd == evSlot:
				var buf [8]byte
				_, _ = rawio.Read(l.evfd, buf[:])
				continue
			case ev.Pad == listenerTag:
				l.accept(ev.Fd)
				again = true
				continue
			}
			if c := l.conns[ev.Fd]; c != nil {
				c.event(ev.Events, ev.Pad)
			}
		}
		if again || len(l.ready) > 0 || !l.parking() {
			continue
		}
		return false
	}
}

// takeInbox runs the commands other goroutines posted.
func (l *Loop) takeInbox() {
	l.mu.Lock()
	cmds := l.inbox
	l.inbox = l.spare[:0]
	l.mu.Unlock()
	for _, cmd := range cmds {
		l.do(cmd)
	}
	clear(cmds)
	l.spare = cmds
}

// parking prepares to park: the next timer becomes the read deadline,
// and posters learn they must wake the loop. It reports false (do not
// park) when a command came in meanwhile.
func (l *Loop) parking() bool {
	at, ok := l.timers.next()
	if l.paused > 0 && (!ok || l.resumeAt < at) {
		at, ok = l.resumeAt, true
	}
	if ok && (l.deadlineAt == 0 || at < l.deadlineAt) {
		l.deadlineAt = at
		_ = l.file.SetReadDeadline(l.base.Add(time.Duration(at)))
	}
	l.sleeping.Store(true)
	l.mu.Lock()
	pending := len(l.inbox) > 0
	l.mu.Unlock()
	if pending {
		l.sleeping.Store(false)
		return false
	}
	return true
}

func (l *Loop) do(cmd loopCmd) {
	switch cmd.op {
	case cmdListen:
		l.listen(cmd.ln)
	case cmdUnlisten:
		l.unlisten(cmd.ln)
		close(cmd.done)
	case cmdQuiet:
		cmd.c.quietAt(cmd.at)
	case cmdReset:
		cmd.c.abort()
	case cmdStop:
		l.stop = true
	case cmdAdopt:
		l.held.Add(-1) // the slot start takes counts it from now on
		l.start(cmd.fd, cmd.h)
	}
}

// runReady gives the connections that used up their turn another.
func (l *Loop) runReady() {
	ready := l.ready
	l.ready = nil
	for _, c := range ready {
		c.queued = false
		c.pump()
	}
	if l.ready == nil {
		l.ready = ready[:0]
	}
}

func (l *Loop) fireTimers() {
	for {
		t := l.timers.popDue(l.now)
		if t == nil {
			return
		}
		t.c.timer(t)
	}
}

// shutdown resets every connection still open and closes the loop.
func (l *Loop) shutdown() {
	for _, c := range l.conns {
		if c != nil {
			c.stop()
		}
	}
	l.file.Close()
	l.mu.Lock()
	l.closed = true
	unix.Close(l.evfd)
	orphans := l.inbox
	l.inbox = nil
	l.mu.Unlock()
	// Clients handed over after the loop took its last commands: nobody
	// else will relay them.
	for _, cmd := range orphans {
		if cmd.op == cmdAdopt {
			resetClose(cmd.fd)
			cmd.h.Failed(ErrLoopStopped)
		}
	}
	close(l.done)
}

func (l *Loop) slot(c *LoopConn) int32 {
	if n := len(l.free); n > 0 {
		s := l.free[n-1]
		l.free = l.free[:n-1]
		l.conns[s] = c
		l.held.Add(1)
		return s
	}
	l.held.Add(1)
	l.conns = append(l.conns, c)
	return int32(len(l.conns) - 1)
}

// nextTag is a new registration's tag for side (LoopConn.tags): positive,
// 30 bits of sequence and the side.
func (l *Loop) nextTag(side int32) int32 {
	l.tagSeq = (l.tagSeq + 1) & (1<<30 - 1)
	if l.tagSeq == 0 {
		l.tagSeq = 1
	}
	return int32(l.tagSeq<<1) | side
}

// register adds fd to the epoll set, edge-triggered, for both directions.
func (l *Loop) register(fd int, slot int32, tag int32) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: slot, Pad: tag}
	return rawio.EpollAdd(l.epfd, fd, &ev)
}

func (l *Loop) queue(c *LoopConn) {
	if !c.queued {
		c.queued = true
		l.ready = append(l.ready, c)
	}
}
