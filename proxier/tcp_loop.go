package proxier

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// The TCP data paths (Options.DataPath, --data-path). The library's zero
// value is the goroutine relay, the only one that dials through
// Options.Dialer (tests inject failures there); the binary defaults to the
// event loop.
const (
	// DataPathGoroutines relays each connection with a goroutine per
	// direction (relay.Conn): every feature, faults included.
	DataPathGoroutines = "goroutines"
	// DataPathEventLoop relays fault-free connections on a few epoll
	// loops (relay.Group): no goroutine per connection, less CPU per new
	// connection and less memory per idle one. Faulted connections still
	// take the goroutine relay.
	DataPathEventLoop = "eventloop"
)

// DataPaths lists the valid Options.DataPath values.
var DataPaths = []string{DataPathGoroutines, DataPathEventLoop}

// newLoopGroup starts the event loops; without them (no epoll, no
// eventfd: never seen on Linux) the goroutine relay serves instead.
func newLoopGroup(opts Options) *relay.Group {
	n := opts.EventLoops
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	g, err := relay.NewGroup(n, relay.LoopOptions{
		DialTimeouts: opts.DialTimeouts, HalfCloseTimeout: opts.HalfCloseTimeout,
		WriteTimeout: opts.WriteTimeout, Quiet: opts.ConnectionCloseQuiet,
		CloseDeadline: opts.ConnectionCloseDeadline, Liveness: opts.Liveness,
	})
	if err != nil {
		klog.ErrorS(err, "Cannot start the event loops; relaying with goroutines")
		return nil
	}
	return g
}

// takeListener takes ln's socket out of the runtime's poller for the
// event loops: a duplicate descriptor, ln closed.
func takeListener(ln *net.TCPListener) (int, error) {
	raw, err := ln.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var dupErr error
	if err := raw.Control(func(lfd uintptr) { fd, dupErr = unix.FcntlInt(lfd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if dupErr != nil {
		return -1, os.NewSyscallError("fcntl", dupErr)
	}
	ln.Close()
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// InOrder asks the loops to accept the port's clients one at a time while
// their connection numbers decide faults (relay.OrderedAcceptor): Accepted
// numbers them, and loops racing between accept4 and Accepted would
// number them in the scheduler's order, not the kernel's.
func (s *tcpProxySocket) InOrder() bool {
	return s.faults != nil && s.faults.InOrder()
}

// Accepted gives a client of the event loops its handler, or relays it
// with goroutines when its connection draws a fault (relay.Acceptor). A
// connection only tracked for the fault API stays on the loops: the API's
// cut resets it there. The loops call it in the kernel's accept order
// while InOrder says so, which Accept's numbering relies on. A client past
// the socket's share is reset here, before it draws a fault, as the loops
// reset one in the descriptor reserve; one admitted leaves the share at its
// Failed or Ended, or when serve is done with it.
func (s *tcpProxySocket) Accepted(fd int, from netip.AddrPort) relay.Handler {
	if !s.cfg.tcpShares.admit(&s.held) {
		s.clientFailed(from, errPortConnectionLimit) // before the client can see it
		relay.ResetClose(fd)
		return nil
	}
	h := &loopClient{s: s, from: from}
	if s.faults != nil {
		h.num = faultNumber{s.faults, s.faults.NextConn()}
		if fc := s.faults.AcceptNumbered(from.Addr(), h.num.seq); fc != nil {
			if !fc.Faulted() && !fc.Refuse {
				h.fc = fc
				return h
			}
			conn, err := fdConn(fd)
			if err != nil {
				klog.ErrorS(err, "Cannot relay a faulted connection", "servicePort", s.label)
				s.held.Add(-1)
				fc.Done()
				return nil
			}
			go s.serve(conn, from, fc, h.num)
			return nil
		}
	}
	return h
}

// Refused counts a client the event loops refused as they accepted it (its
// descriptor fell in the reserve), as a dial's local shortage is counted.
func (s *tcpProxySocket) Refused(from netip.AddrPort, err error) {
	s.clientFailed(from, err)
}

// AcceptFailed counts an accept error of the event loops.
func (s *tcpProxySocket) AcceptFailed(err error) {
	s.acceptErrors.Inc()
	if !isTemporaryAcceptError(err) {
		klog.ErrorS(err, "Accept failed", "servicePort", s.label)
	}
}

// fdConn makes a *net.TCPConn of a bare descriptor (which it takes).
func fdConn(fd int) (*net.TCPConn, error) {
	f := os.NewFile(uintptr(fd), "")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, errors.New("not a TCP connection")
	}
	return tc, nil
}

// loopClient is the proxier's side of one connection on the event loops
// (relay.Handler): the balancer's choice per attempt, metrics, the
// connection registry and the port's lifetime.
type loopClient struct {
	s    *tcpProxySocket
	from netip.AddrPort
	live *liveConn
	// fc tracks the connection for the fault API (nil: not tracked).
	fc *faults.Conn
	// num is its number on the fault port, for a declared down's cut when
	// faults does not track it (connections.go cutDowns).
	num faultNumber
	// failed are the endpoints this connection's dial attempts failed on,
	// which a retry moves past (in the order tried).
	failed []netip.AddrPort
}

func (h *loopClient) Backend(attempt int) (netip.AddrPort, error) {
	ep, err := h.pick(attempt)
	if err != nil {
		return ep, err
	}
	ep, h.failed, err = h.s.pastOwnPortals(h.from.Addr(), ep, h.failed)
	return ep, err
}

func (h *loopClient) pick(attempt int) (netip.AddrPort, error) {
	if attempt == 0 {
		return h.s.sp.Next(h.from.Addr(), false)
	}
	// Past the endpoints that failed (affinity moves the client on: its
	// pinned endpoint was the first).
	h.s.retries.Inc()
	return h.s.sp.Retry(h.from.Addr(), h.failed)
}

func (h *loopClient) DialFailed(ep netip.AddrPort, err error) {
	h.failed = append(h.failed, ep) // a few: one per attempt, only after a failure
	h.s.dialFailures.Inc()
	klog.V(3).InfoS("Dial failed, trying next endpoint", "servicePort", h.s.label, "endpoint", ep, "err", err)
}

func (h *loopClient) Failed(err error) {
	switch {
	case errors.Is(err, relay.ErrClientGone):
		h.s.abandoned.Inc()
	case errors.Is(err, relay.ErrLoopStopped):
		// A client the loops still held at shutdown, handed over or
		// dialing, is no endpoint's failure: not one to count or to
		// report as "no endpoint".
	default:
		h.s.clientFailed(h.from, withEndpointsTried(err, h.failed))
	}
	h.s.held.Add(-1)
	if h.fc != nil {
		h.fc.Done()
	}
}

func (h *loopClient) Connected(c *relay.LoopConn, ep netip.AddrPort) {
	h.failed = nil
	s := h.s
	s.active.Inc()
	h.live = s.cfg.conns.addLoop(s.label, h.from, ep, c, h.fc, h.num, s.bytesIn, s.bytesOut)
	h.live.sp, h.live.lifetime = s.sp, s.lifetime
	h.live.relay.Store(quietCloser(c))
	startLifetime(c, s.lifetime.load())
	if h.fc != nil {
		h.fc.AttachReset(c.Reset)
	} else {
		h.live.cutIfDownSinceAccept()
	}
}

func (h *loopClient) Ended(in, out int64) {
	h.live.in.Add(float64(in))
	h.live.out.Add(float64(out))
	h.s.lifetimeEnded(h.live.loop.QuietEnd(), h.live)
	h.live.end()
	h.s.active.Dec()
	h.s.held.Add(-1)
	if h.fc != nil {
		h.fc.Done()
	}
}
