package relay

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// Attempt is the context of one dial attempt through a net.Dialer whose
// ControlContext is AttemptControl's (the goroutine relay's backend
// dialers): it ends when its time is up, unless by then the backend has
// answered the connect.
//
// net's connect waits for the connecting socket to become writable in the
// runtime's poller, with the poller's write deadline when the context has
// a deadline. A process held past that deadline (CPU throttling, a paused
// VM: every thread stopped) runs its due timers before it polls for
// network events when it resumes, so the deadline ended a connect the
// backend had answered in time: a dial failure counted, the backend saw a
// connection opened and closed, the client was dialled again on another
// endpoint, and a ClientIP client was re-pinned off a healthy one (the
// event loop had the same fault, see LoopConn.timer). So an Attempt says
// it has no deadline; its own timer asks the kernel first whether the
// connect is still in progress, as the event loop does, and only then
// ends the attempt (net's wait, through AfterFunc, and Done). A test's
// Dialer that has no ControlContext is ended by Done at its time. The
// cost: a timer and four small allocations per attempt, no system call
// unless the time runs out (BenchmarkDialAttempt).
type Attempt struct {
	timer *time.Timer
	done  chan struct{}

	mu sync.Mutex
	// socket is the attempt's socket, from AttemptControl (nil: not yet,
	// or another dialer); wake is net's wake-up of its wait (AfterFunc).
	socket  syscall.RawConn
	wake    func()
	expired bool
}

var _ context.Context = (*Attempt)(nil)

// NewAttempt starts an attempt of timeout; Stop it once the dial returned.
func NewAttempt(timeout time.Duration) *Attempt {
	a := &Attempt{done: make(chan struct{})}
	a.timer = time.AfterFunc(timeout, a.expire)
	return a
}

// Stop releases the attempt's timer and socket once the dial returned.
func (a *Attempt) Stop() {
	a.timer.Stop()
	a.mu.Lock()
	a.socket, a.wake = nil, nil
	a.mu.Unlock()
}

// AttemptControl is control (DialControl, BackendControl) as a
// net.Dialer's ControlContext that also hands an Attempt its socket.
func AttemptControl(control func(network, address string, c syscall.RawConn) error) func(ctx context.Context, network, address string, c syscall.RawConn) error {
	return func(ctx context.Context, network, address string, c syscall.RawConn) error {
		if a, ok := ctx.(*Attempt); ok {
			a.mu.Lock()
			a.socket = c
			a.mu.Unlock()
		}
		return control(network, address, c)
	}
}

// expire ends the attempt when its time is up, unless the backend has
// answered: the poller will wake net's wait for that answer.
func (a *Attempt) expire() {
	a.mu.Lock()
	if a.socket != nil && answered(a.socket) {
		a.mu.Unlock()
		return
	}
	a.expired = true
	wake := a.wake
	a.mu.Unlock()
	close(a.done)
	if wake != nil {
		wake() // not under mu: it asks Err
	}
}

// answered tells whether the connect of socket has been answered with a
// connection. A refused one (CLOSE) and one never started (CLOSE too)
// count as not: the attempt ends, as it would by a deadline.
func answered(socket syscall.RawConn) bool {
	state := -1
	if socket.Control(func(fd uintptr) { state = rawio.TCPState(int(fd)) }) != nil {
		return false // closed: the dial is over
	}
	return state != -1 && state != rawio.TCPSynSent && state != rawio.TCPClose
}

// Deadline says none: the attempt's timer ends it (see Attempt).
func (a *Attempt) Deadline() (time.Time, bool) { return time.Time{}, false }

func (a *Attempt) Done() <-chan struct{} { return a.done }

func (a *Attempt) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.expired {
		return context.DeadlineExceeded
	}
	return nil
}

func (a *Attempt) Value(any) any { return nil }

// AfterFunc lets context.AfterFunc (net's connect wakes its wait with it)
// register f here: expire calls it, and no goroutine waits on Done.
func (a *Attempt) AfterFunc(f func()) (stop func() bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.expired {
		// Over already. Not called here: context.AfterFunc holds a lock
		// that f takes.
		go f()
		return stopNothing
	}
	a.wake = f
	return func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		stopped := !a.expired && a.wake != nil
		a.wake = nil
		return stopped
	}
}

func stopNothing() bool { return false }
