package relay

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// Attempt is the context of one dial attempt through a net.Dialer whose
// ControlContext is AttemptControl's (the goroutine relay's backend
// dialers): it ends when its time is up, unless by then the backend has
// answered the connect, and one for a client (NewClientAttempt) when
// that client resets.
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
	// client is the connection the dial is for (nil: none watched), and
	// end when the attempt's time is up (set with client).
	client *net.TCPConn
	end    time.Time

	mu sync.Mutex
	// socket is the attempt's socket, from AttemptControl (nil: not yet,
	// or another dialer); wake is net's wake-up of its wait (AfterFunc).
	socket  syscall.RawConn
	wake    func()
	expired bool
	// gone: the client reset, which ended the attempt (expired too).
	gone    bool
	stopped bool
	// watched is closed once the watch of the client ended (nil: none
	// started).
	watched chan struct{}
}

var _ context.Context = (*Attempt)(nil)

// ErrClientGone ends a dial whose client reset (or whose socket failed)
// before an endpoint answered: nobody is left to relay for, and no
// endpoint is at fault.
var ErrClientGone = errors.New("relay: the client left while its backend was dialled")

// NewAttempt starts an attempt of timeout; Stop it once the dial returned.
func NewAttempt(timeout time.Duration) *Attempt {
	a := &Attempt{done: make(chan struct{})}
	a.timer = time.AfterFunc(timeout, a.expire)
	return a
}

// clientWatchAfter is how long an attempt for a client dials before it
// watches the client too: a backend answers most dials well within it,
// and those cost no more than an Attempt without a client.
const clientWatchAfter = 10 * time.Millisecond

// NewClientAttempt is NewAttempt for a dial made for client, which also
// ends, with ClientGone, when client resets (or is closed): a client that left is not
// dialled for on until the attempt's time is up (its descriptor and the
// backend socket held, the attempt counted as the endpoint's failure).
// Its FIN alone does not end it: a client may send its request and
// half-close before the backend answers, and is served. The watch starts
// once the attempt has dialled for clientWatchAfter: in the attempt's
// timer (one timer still), parked on the client's read side in the
// runtime's poller, which wakes it at the client's data, FIN or reset.
// Nobody else reads the client while it dials; Stop ends the watch.
func NewClientAttempt(timeout time.Duration, client *net.TCPConn) *Attempt {
	if timeout <= clientWatchAfter {
		return NewAttempt(timeout)
	}
	a := &Attempt{done: make(chan struct{}), client: client, end: time.Now().Add(timeout)}
	// Set under mu, which fire takes before it reads (Resets) the timer:
	// a dial goroutine descheduled past clientWatchAfter between
	// AfterFunc's return and this store left fire a nil timer.
	a.mu.Lock()
	a.timer = time.AfterFunc(clientWatchAfter, a.fire)
	a.mu.Unlock()
	return a
}

// Stop releases the attempt's timer and socket once the dial returned,
// and ends the watch of its client, whose read deadline it then leaves
// cleared.
func (a *Attempt) Stop() {
	a.mu.Lock()
	a.stopped = true
	a.socket, a.wake = nil, nil
	watched := a.watched
	a.mu.Unlock()
	// After stopped is set: fire re-arms the timer only before.
	a.timer.Stop()
	if watched != nil {
		_ = a.client.SetReadDeadline(aLongTimeAgo) // wakes the watch
		<-watched
		_ = a.client.SetReadDeadline(time.Time{})
	}
}

// aLongTimeAgo is a deadline that has passed.
var aLongTimeAgo = time.Unix(1, 0)

// ClientGone tells whether the client's reset ended the attempt: the dial
// failed for that, or its answer came as the client left (the caller
// closes it).
func (a *Attempt) ClientGone() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gone
}

// fire is the timer of an attempt for a client: at clientWatchAfter it
// re-arms for the attempt's end and watches the client; at the end it
// expires.
func (a *Attempt) fire() {
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		return
	}
	if a.watched != nil {
		a.mu.Unlock()
		a.expire()
		return
	}
	watched := make(chan struct{})
	a.watched = watched
	a.timer.Reset(time.Until(a.end))
	a.mu.Unlock()
	a.watchClient(watched)
}

// watchClient waits in the poller for the client's reset, until Stop's
// deadline wakes it; then it closes watched. A client closed meanwhile
// (the proxy's stop resets its pending clients) ends the attempt as its
// reset does: its backend socket is not kept for the attempt's time.
func (a *Attempt) watchClient(watched chan struct{}) {
	defer close(watched)
	raw, err := a.client.SyscallConn()
	if err == nil {
		err = raw.Read(rawio.TCPClosed) // the client's data and FIN do not end it
	}
	if err == nil || errors.Is(err, net.ErrClosed) {
		a.leave()
	}
}

// leave ends the attempt for its client's reset.
func (a *Attempt) leave() {
	a.mu.Lock()
	if a.expired {
		a.mu.Unlock()
		return
	}
	a.expired, a.gone = true, true
	wake := a.wake
	a.mu.Unlock()
	close(a.done)
	if wake != nil {
		wake() // not under mu: it asks Err
	}
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
	if a.expired || a.socket != nil && answered(a.socket) {
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
	switch {
	case a.gone:
		return context.Canceled
	case a.expired:
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
