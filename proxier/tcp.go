package proxier

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// tcpProxySocket accepts client connections for one service port. With
// the event loops (socketConfig.loops) the loops accept, dial and relay;
// otherwise its accept loop only accepts: picking, dialing and copying
// happen in a goroutine per connection. Either way a slow or dead endpoint
// never delays other clients.
type tcpProxySocket struct {
	name  loadbalancer.ServicePortName
	label string
	addr  *net.TCPAddr // where it listens
	// ln accepts for the goroutine relay; with event loops, loopLn holds
	// the listening socket instead (ln is nil).
	ln        *net.TCPListener
	loopLn    *relay.Listener
	sp        *loadbalancer.ServicePort
	cfg       *socketConfig
	noBackend noBackendLog
	// faults decides each connection's toxics at accept.
	faults *faults.Port
	// lifetime is the port's max age and drain time.
	lifetime *portLifetime
	// numbered: bound to a port by number, so it can stop listening while
	// its fault port is down (tcp_refuse.go); stopWatch ends that.
	numbered  bool
	stopWatch func()
	gate      acceptGate
	// listenMu orders setListening with its retries; listenErr is why
	// the socket does not listen although its port is up (nil: it
	// listens, or the port is down).
	listenMu  sync.Mutex
	listenErr error
	retrying  bool // a retryListening is scheduled
	refusing  bool // the port went down and the socket has not listened since

	// held counts the socket's connections, from accept to end, against
	// its share (cfg.tcpShares; tcp_share.go).
	held atomic.Int64

	// The port's series (port_metrics.go), resolved once, not per connection.
	active                                                         *gauge
	failed, retries, dialFailures, acceptErrors, bytesIn, bytesOut *counter
	closedQuiet, closedAtDeadline, abandoned                       *counter
	// atShare and atCeiling count clients refused at the socket's share
	// and at the descriptor ceiling.
	atShare, atCeiling *counter

	closer
}

func newTCPProxySocket(name loadbalancer.ServicePortName, ln *net.TCPListener, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) (*tcpProxySocket, error) {
	s := newTCPSocketState(name, ln.Addr().(*net.TCPAddr), sp, fp, cfg)
	if cfg.loops == nil {
		s.ln = ln
		return s, nil
	}
	fd, err := takeListener(ln)
	if err != nil {
		return nil, err
	}
	s.loopLn = cfg.loops.Listen(fd, s)
	return s, nil
}

// newLoopTCPProxySocket serves fd, a listening socket bound to at, on the
// event loops (which own it from now on).
func newLoopTCPProxySocket(name loadbalancer.ServicePortName, fd int, at netip.AddrPort, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) *tcpProxySocket {
	s := newTCPSocketState(name, net.TCPAddrFromAddrPort(at), sp, fp, cfg)
	s.loopLn = cfg.loops.Listen(fd, s)
	return s
}

func newTCPSocketState(name loadbalancer.ServicePortName, addr *net.TCPAddr, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) *tcpProxySocket {
	label := name.String()
	m := cfg.metrics.ports.forPort(label, false)
	return &tcpProxySocket{
		name: name, label: label, addr: addr, sp: sp, cfg: cfg, faults: fp, closer: newCloser(),
		lifetime: cfg.lifetimes.port(name),
		active:   &m.active, failed: &m.failed, retries: &m.dialRetries, dialFailures: &m.dialFailures,
		acceptErrors: &m.acceptErrors, bytesIn: &m.bytesIn, bytesOut: &m.bytesOut,
		closedQuiet: &m.closedQuiet, closedAtDeadline: &m.closedAtDeadline, abandoned: &m.abandoned,
		atShare: &m.tcpAtShare, atCeiling: &m.tcpAtCeiling,
	}
}

func (s *tcpProxySocket) Port() int { return s.addr.Port }

func (s *tcpProxySocket) Close() error {
	if s.stopWatch != nil {
		s.stopWatch()
		s.listenMu.Lock()
		s.listenFailed(nil) // nothing to retry, nor to count, once closed
		s.listenMu.Unlock()
	}
	if s.loopLn != nil {
		return s.closeWith(s.loopLn.Close)
	}
	return s.closeWith(s.ln.Close)
}

// Start starts the accept loop, unless the event loops accept for the
// socket: a goroutine waiting in it for Close held 3.6-3.8 KiB of stack per
// idle service port.
func (s *tcpProxySocket) Start() {
	if s.loopLn == nil {
		go s.acceptLoop()
	}
	s.watchEnabled()
}

func (s *tcpProxySocket) acceptLoop() {
	backoff := time.Duration(0)
	for {
		since := s.gate.refusals.Load()
		conn, err := s.ln.AcceptTCP()
		if err != nil {
			select {
			case <-s.closed:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if wait, refused := s.gate.refused(since); refused {
				// Not listening (its port is down): no failure.
				if wait != nil {
					select {
					case <-wait:
					case <-s.closed:
						return
					}
				}
				continue
			}
			s.acceptErrors.Inc()
			if !isTemporaryAcceptError(err) {
				klog.ErrorS(err, "Accept failed", "servicePort", s.label)
			}
			backoff = nextBackoff(backoff, s.cfg.acceptBackoffBase)
			select {
			case <-time.After(backoff):
			case <-s.closed:
				return
			}
			continue
		}
		backoff = 0
		from := clientAddr(conn.RemoteAddr())
		if !s.cfg.tcpShares.admit(&s.held) {
			s.clientFailed(from, errPortConnectionLimit) // before the client can see it
			resetTCP(conn)
			continue
		}
		// Decided here, in the kernel's accept order: the goroutines
		// start in the scheduler's. Numbered here but decided there, the
		// numbers were right, but --fault-max-active's slots went to the
		// connections whose goroutines ran first (6 connections under a
		// cap of 2 faulted the 1st and the 6th), where the event loops,
		// which decide as they accept, faulted the first ones.
		var fc *faults.Conn
		var num faultNumber
		if s.faults != nil {
			num = faultNumber{s.faults, s.faults.NextConn()}
			fc = s.faults.AcceptNumbered(from.Addr(), num.seq)
		}
		go s.serve(conn, from, fc, num)
	}
}

func nextBackoff(cur, base time.Duration) time.Duration {
	if base <= 0 {
		base = 5 * time.Millisecond
	}
	if cur == 0 {
		return base
	}
	if cur *= 2; cur > time.Second {
		cur = time.Second
	}
	return cur
}

// serve relays one accepted client with the goroutine relay; fc are its
// faults (nil: none), num its number on the fault port. The client was
// admitted to the socket's share: a client that is not relayed leaves it
// here, a relayed one when relay ends.
func (s *tcpProxySocket) serve(client *net.TCPConn, from netip.AddrPort, fc *faults.Conn, num faultNumber) {
	relaying := false
	defer func() {
		if !relaying {
			s.held.Add(-1)
		}
	}()
	conns := s.cfg.conns
	// Registered before the connect_delay and the dial: the stop resets
	// the client then too, which the process's exit ended with a FIN.
	if !conns.addPending(client, from) {
		resetTCP(client)
		if fc != nil {
			fc.Done()
		}
		return
	}
	// Looked at before the faults' steps: a connect_delay held the
	// reserved descriptor for its whole delay.
	inReserve := relay.ConnInReserve(client)
	if fc != nil && !inReserve {
		if fc.Refuse {
			s.drop(client, from, fc)
			return
		}
		if !fc.WaitConnectDelay(client) {
			// The client reset during the delay, which stands in for a
			// slow connect: it left as during a dial (unless the stop
			// closed it).
			if !conns.isStopped() {
				s.abandoned.Inc()
			}
			s.drop(client, from, fc)
			return
		}
	}
	var backend *net.TCPConn
	err := relay.ErrDescriptorReserve
	if !inReserve {
		backend, err = s.dial(client, from, fc != nil)
	}
	if conns.isStopped() {
		// The stop reset the client while it dialled: nothing to relay,
		// and a dial that failed since is no endpoint's failure (the
		// event loops fail such a dial with relay.ErrLoopStopped).
		resetTCP(backend)
		s.drop(client, from, fc)
		return
	}
	if errors.Is(err, relay.ErrClientGone) {
		// The client reset while its backend was dialled: the dial is
		// abandoned, no endpoint failed and nobody is left to tell.
		s.abandoned.Inc()
		s.drop(client, from, fc)
		return
	}
	if err != nil {
		// Counted before the reset, so that a client (or a test) that
		// saw it finds it counted; a reset, not a FIN: the client must
		// not mistake "no backend" for an empty answer.
		s.clientFailed(from, err)
		s.drop(client, from, fc)
		return
	}
	if fc == nil {
		// The dial held the handshake's last ACK for the client's first
		// bytes (relay.DialControl; a test's Dialer holds none, and this
		// is a no-op).
		relay.ReleaseHandshakeACK(backend, client)
	}
	relaying = true
	go s.relay(s.start(client, backend, from, fc, num))
}

// drop ends a client serve will not relay: out of the pending set,
// reset, its faults' slot given back (its share's, serve's deferred
// release).
func (s *tcpProxySocket) drop(client *net.TCPConn, from netip.AddrPort, fc *faults.Conn) {
	s.cfg.conns.removePending(client, from)
	resetTCP(client)
	if fc != nil {
		fc.Done()
	}
}

// start registers a connection whose backend answered and prepares its
// relay.
func (s *tcpProxySocket) start(client, backend *net.TCPConn, from netip.AddrPort, fc *faults.Conn, num faultNumber) (*relay.Conn, *liveConn, *faults.Conn) {
	s.active.Inc()
	live := s.cfg.conns.addTCP(s.label, from, client, backend, fc, num, s.bytesIn, s.bytesOut)
	opts := relay.Options{HalfCloseTimeout: s.cfg.halfCloseTimeout, WriteTimeout: s.cfg.writeTimeout,
		Quiet: s.cfg.closeQuiet, CloseDeadline: s.cfg.closeDeadline, In: &live.in, Out: &live.out}
	if fc != nil {
		opts.Upstream, opts.Downstream = fc.Upstream, fc.Downstream
		opts.OnAbort = fc.Abort
		fc.SetBounds(s.cfg.halfCloseTimeout, s.cfg.writeTimeout)
		fc.Attach(client, backend)
	}
	rc := relay.New(client, backend, opts)
	if fc == nil {
		rc.BackendHoldsACK() // backendDialer held it
	}
	live.sp, live.lifetime = s.sp, s.lifetime
	live.relay.Store(quietCloser(rc))
	startLifetime(rc, s.lifetime.load())
	live.cutIfDownSinceAccept()
	return rc, live, fc
}

// relay copies both ways until the connection ends. It runs in a goroutine
// of its own rather than in handle's, whose stack the dial grew to 8 KiB
// (a parked goroutine keeps its stack): so an idle connection's two
// goroutines hold 2-4 KiB each.
func (s *tcpProxySocket) relay(rc *relay.Conn, live *liveConn, fc *faults.Conn) {
	rc.Run()
	if fc != nil {
		fc.Done()
	}
	s.lifetimeEnded(rc.QuietEnd(), live)
	live.end()
	s.active.Dec()
	s.held.Add(-1)
}

// dial dials a backend for client (from from): attempts past the
// endpoints that failed, ended with relay.ErrClientGone once client reset.
func (s *tcpProxySocket) dial(client *net.TCPConn, from netip.AddrPort, faulted bool) (*net.TCPConn, error) {
	dialer := s.cfg.dialer
	if faulted {
		dialer = s.cfg.faultDialer
	}
	var lastErr error
	var tried [maxDialAttempts]netip.AddrPort
	failed := tried[:0]
	for _, timeout := range s.cfg.dialTimeouts {
		// After a failure, past the endpoints that failed (affinity
		// moves the client on: its pinned endpoint was the first).
		ep, err := s.next(from.Addr(), failed)
		if err == nil {
			ep, failed, err = s.pastOwnPortals(from.Addr(), ep, failed)
		}
		if err != nil {
			return nil, withEndpointsTried(err, failed)
		}
		attempt := relay.NewClientAttempt(timeout, client)
		backend, err := dialer.DialContext(attempt, "tcp", ep.String())
		attempt.Stop()
		if attempt.ClientGone() {
			// Neither the endpoint's failure nor, if it answered as the
			// client left, a connection to relay.
			if tc, ok := backend.(*net.TCPConn); ok {
				resetTCP(tc)
			} else if backend != nil {
				backend.Close()
			}
			return nil, relay.ErrClientGone
		}
		if err == nil {
			if tc, ok := backend.(*net.TCPConn); ok {
				return tc, nil
			}
			backend.Close()
			return nil, errors.New("dialer returned a non-TCP connection")
		}
		if relay.LocalShortage(err) {
			// Out of descriptors or ports here: the endpoint is not at
			// fault and the next would fail alike (nor may the client's
			// affinity move for it).
			return nil, err
		}
		if s.cfg.conns.isStopped() {
			// The stop reset the client during this attempt: no next
			// one, and no failure to count (serve).
			return nil, err
		}
		lastErr = err
		failed = append(failed, ep)
		s.dialFailures.Inc()
		klog.V(3).InfoS("Dial failed, trying next endpoint", "servicePort", s.label, "endpoint", ep, "err", err)
	}
	return nil, withEndpointsTried(lastErr, failed)
}

// maxDialAttempts bounds a connection's dial attempts (socketConfig's
// dialTimeouts, at most this many).
const maxDialAttempts = 8

// next is a dial attempt's endpoint: the balancer's next, and after
// failures on failed, its retry past them.
func (s *tcpProxySocket) next(client netip.Addr, failed []netip.AddrPort) (netip.AddrPort, error) {
	if len(failed) == 0 {
		return s.sp.Next(client, false)
	}
	s.retries.Inc()
	return s.sp.Retry(client, failed)
}

// pastOwnPortals is ep, or past the proxy's own portals (ownPortals.pass).
func (s *tcpProxySocket) pastOwnPortals(client netip.Addr, ep netip.AddrPort, failed []netip.AddrPort) (netip.AddrPort, []netip.AddrPort, error) {
	return s.cfg.ownPortals.pass(iptables.TCP, s.sp, s.label, client, ep, failed)
}
