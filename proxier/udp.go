package proxier

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// udpProxySocket relays datagrams for one service port. Each client ip:port
// gets a session: a connected socket to the chosen backend. One goroutine
// serves the port whatever the number of sessions: it waits on the service
// socket and every backend socket at once (udpPoller), relays client
// datagrams to backends and writes replies back through the service socket,
// from the address the client sent to, so that conntrack turns their source
// back into the service address. One wake-up serves whatever is ready in
// either direction (two goroutines, one per direction, were two wake-ups per
// request/response under load).
type udpProxySocket struct {
	name      loadbalancer.ServicePortName
	label     string
	conn      *net.UDPConn
	sp        *loadbalancer.ServicePort
	cfg       *socketConfig
	noBackend noBackendLog
	// faults shapes datagrams; its plan is loaded per datagram (one atomic
	// load, nil when no toxic applies).
	faults *faults.Port
	// replyFromDestination: the socket listens on the wildcard address and
	// reports each datagram's destination. oobLen is the room for a
	// datagram's control messages: those, and a UDP_GRO segment size.
	replyFromDestination bool
	oobLen               int
	// serviceFD is the service socket's descriptor as the poller reports
	// it, serviceFamily its address family; drainFn and sendRepliesFn are
	// drain and sendReplies as func values, built once (a method value made
	// per wake-up would be an allocation each), run through serviceRaw's
	// Control so Close cannot release the descriptor while they use it.
	serviceFD     int
	serviceFamily int
	serviceRaw    syscall.RawConn
	drainFn       func(fd uintptr)
	sendRepliesFn func(fd uintptr)
	// batch is the serving goroutine's for one wake-up (nil between them).
	batch *udpBatch
	// noGSO: the kernel refused a GSO send on this socket (no UDP_SEGMENT,
	// no checksum offload on the route, a path MTU below a segment): its
	// replies go one datagram per message from then on. gsoSends counts
	// the GSO buffers sent. Both are the serving goroutine's.
	noGSO    bool
	gsoSends int
	// The same for client datagrams to backends.
	noGSOUp    bool
	gsoSendsUp int
	// groReads counts the slots read holding several datagrams (UDP_GRO),
	// both ways, as the wake-ups' batches counted them; the serving
	// goroutine's.
	groReads int

	// bound is the socket's address (a datagram's destination when it
	// is not the wildcard: udp_unreachable.go).
	bound netip.AddrPort

	sessionsGauge                   *gauge
	dialFailures, bytesIn, bytesOut *counter
	// failed counts the datagrams no endpoint took
	// (connections_failed_total); evicted and capDropped the sessions
	// closed and the datagrams dropped at the session caps
	// (udp_session_limit_total{action}).
	failed              *counter
	evicted, capDropped *counter

	// mu guards sessions and every system call on a backend descriptor, so
	// that none is used after close. Per socket, never global, and never
	// held while another socket's is taken (roomFromOtherPorts).
	mu       sync.Mutex
	sessions udpSessionTable
	poller   *udpPoller
	shut     bool // closed: no new session
	// givenSlot: another port closed an idle session of its own for
	// this port's new client and left it the session's slot in the
	// budget (roomFromOtherPorts); the next session opened takes it, and
	// Close gives it back. Set by the serving goroutine's forward only.
	givenSlot bool
	// held is len(sessions), kept beside it for the other ports' scan
	// for the biggest holder at the total cap (udpHolders), which reads
	// it without this mutex.
	held atomic.Int64
	// checkedGeneration is the endpoint generation every session's
	// backend was last checked against by expireIdle.
	checkedGeneration uint64

	closer
}

func (s *udpProxySocket) datagramFaults() *faults.DatagramPlan {
	if s.faults == nil {
		return nil
	}
	return s.faults.Datagrams()
}

func newUDPProxySocket(name loadbalancer.ServicePortName, conn *net.UDPConn, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) (*udpProxySocket, error) {
	poller, err := newUDPPoller()
	if err != nil {
		return nil, err
	}
	withDst, err := enableDestinationInfo(conn)
	if err != nil {
		poller.close()
		return nil, fmt.Errorf("ask for datagram destinations: %w", err)
	}
	if rc, err := conn.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { growServiceReceiveBuffer(int(fd)) })
	}
	label := name.String()
	m := cfg.metrics.ports.forPort(label, true)
	s := &udpProxySocket{
		name: name, label: label, conn: conn, sp: sp, cfg: cfg, faults: fp,
		replyFromDestination: withDst,
		bound:                conn.LocalAddr().(*net.UDPAddr).AddrPort(),
		sessions:             newUDPSessionTable(),
		poller:               poller,
		closer:               newCloser(),
		sessionsGauge:        &m.udpSessions,
		dialFailures:         &m.dialFailures,
		bytesIn:              &m.bytesIn,
		bytesOut:             &m.bytesOut,
		failed:               &m.failed,
		evicted:              &m.udpEvicted,
		capDropped:           &m.udpDropped,
	}
	if withDst {
		s.oobLen = pktinfoSpace
	}
	s.drainFn = s.drain
	s.sendRepliesFn = s.sendReplies
	cfg.conns.addUDPSocket(s)
	return s, nil
}

// useBalancer makes the socket pick its sessions' endpoints from sp from
// now on; its sessions keep theirs while sp serves them. Their generations
// are the old balancer's, a count of its own that may equal sp's: each is
// checked against sp at its next datagram (and by expireIdle).
func (s *udpProxySocket) useBalancer(sp *loadbalancer.ServicePort) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sp = sp
	s.sessions.each(func(sess *udpSession) { sess.generation = recheckGeneration })
	s.checkedGeneration = recheckGeneration
}

// recheckGeneration is a generation no balancer reaches (it counts from 0,
// one per endpoint change): a session that has it is checked against its
// socket's balancer at its next datagram.
const recheckGeneration = math.MaxUint64

func (s *udpProxySocket) Port() int { return s.conn.LocalAddr().(*net.UDPAddr).Port }

// Close closes the service socket and every session at once.
func (s *udpProxySocket) Close() error {
	return s.closeWith(func() error {
		err := s.conn.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.shut = true
		s.sessions.each(s.closeSessionLocked)
		s.returnGivenSlotLocked()
		s.cfg.conns.removeUDPSocket(s)
		_ = s.poller.close()
		return err
	})
}

func (s *udpProxySocket) Start() { go s.Serve() }

// Serve relays both ways until Close. Waiting holds no buffer: the poller
// parks the goroutine until a socket is readable, and a buffer is taken
// only to empty what is ready.
func (s *udpProxySocket) Serve() {
	raw, err := s.conn.SyscallConn()
	if err != nil {
		s.logUnusable(err)
		return
	}
	s.serviceRaw = raw
	var famErr error
	err = raw.Control(func(fd uintptr) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.serviceFD = int(fd)
		s.serviceFamily, famErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN)
		if enableGRO(int(fd)) {
			s.oobLen += groSpace
		}
		if famErr == nil && enableHopLimits(int(fd), s.serviceFamily) {
			s.oobLen += hopLimitSpace // udp_hoplimit.go
		}
	})
	if err = errors.Join(err, famErr); err != nil {
		s.logUnusable(err)
		return
	}
	if !s.joinPoller(raw) {
		return
	}
	s.relayLoop()
}

// logUnusable logs why Serve cannot serve the service socket, unless it
// was closed: a port closed before its goroutine started (a Service added
// and removed at once, on a loaded node) is not an error.
func (s *udpProxySocket) logUnusable(err error) {
	select {
	case <-s.closed:
	default:
		klog.ErrorS(err, "UDP service socket unusable", "servicePort", s.label)
	}
}

// joinPoller adds the service socket to the port's poller, trying again
// (5 ms, doubling to 1 s) while epoll refuses it (ENOMEM; ENOSPC at
// fs.epoll.max_user_watches, which a flood of sessions can reach): given
// up, the port would stay bound and routed to, and drop every datagram.
// It reports false when the port closed first.
func (s *udpProxySocket) joinPoller(raw syscall.RawConn) bool {
	var backoff time.Duration
	for {
		var addErr error
		err := raw.Control(func(fd uintptr) {
			s.mu.Lock() // add is serialised with close
			defer s.mu.Unlock()
			if !s.shut {
				addErr = s.poller.add(int(fd))
			}
		})
		if err != nil {
			return false // closed
		}
		if addErr == nil {
			return true
		}
		backoff = nextBackoff(backoff, s.cfg.acceptBackoffBase)
		klog.ErrorS(addErr, "UDP service socket cannot be polled; trying again", "servicePort", s.label, "after", backoff)
		select {
		case <-time.After(backoff):
		case <-s.closed:
			return false
		}
	}
}

// refusedLocked ends a session whose endpoint refused its datagrams (an
// ICMP port unreachable): counted as the endpoint's failure, as a refused
// TCP dial is, and logged at -v=2. It ended in no counter and no line, so
// UDP to a dead endpoint was invisible. The client is told with a port
// unreachable of its own, as the endpoint's reaches it through kube-proxy's
// DNAT (a DNS client gave up on the server at once instead of waiting out
// its timeout); its next datagram picks again, past this endpoint (the
// balancer's Failed).
func (s *udpProxySocket) refusedLocked(sess *udpSession, err error) {
	s.endpointFailedLocked(sess, nil, err)
}

// endpointFailedLocked ends a session whose endpoint refused its datagrams
// (unreach nil) or could not be reached (unreach, an ICMP destination
// unreachable of another code: udp_recverr.go), telling the client with an
// error of the same code, and counts and logs it likewise.
func (s *udpProxySocket) endpointFailedLocked(sess *udpSession, unreach *icmpError, err error) {
	s.dialFailures.Inc()
	s.cfg.unreachable.endpointFailed(sess.client, sess.local, unreach)
	// With ClientIP affinity the client is pinned to the endpoint that
	// failed: its next datagram must not find the pin again.
	s.sp.Failed(sess.client.Addr(), sess.backend)
	if unreach != nil {
		// The code tells a deleted pod (host unreachable: no ARP/ND
		// answer) from a router's or a firewall's error.
		klog.V(2).InfoS("UDP endpoint could not be reached (ICMP destination unreachable); the client's next datagram picks again",
			"servicePort", s.label, "client", sess.client, "endpoint", sess.backend, "err", err, "code", unreach.code)
	} else {
		klog.V(2).InfoS("UDP endpoint refused the session's datagrams; the client's next datagram picks again",
			"servicePort", s.label, "client", sess.client, "endpoint", sess.backend, "err", err)
	}
	s.closeSessionLocked(sess)
}

// upSenderLocked returns the function that delivers a faulted datagram to
// the session's backend, if the session is still open by then.
func (s *udpProxySocket) upSenderLocked(sess *udpSession) func([]byte) {
	if sess.sendUp == nil {
		sess.sendUp = func(b []byte) {
			s.mu.Lock()
			defer s.mu.Unlock()
			// Shut: the session may be another socket's now (handed
			// over), its fields guarded by that socket's mutex.
			if !s.shut && sess.fd >= 0 {
				if n, err := s.writeSessionLocked(sess, b); err == nil {
					s.bytesIn.Add(float64(n))
				}
			}
			// Not ended by the write (an unreachable endpoint).
			if !s.shut && sess.fd >= 0 {
				// The session idles from when the datagram left, not
				// from when it came in: the backend's answer must find it.
				s.sessions.touch(sess, mono.Now())
			}
		}
	}
	return sess.sendUp
}

// downSenderLocked returns the function that delivers a faulted reply; the
// service socket outlives the session, so a delayed reply needs no session.
func (s *udpProxySocket) downSenderLocked(sess *udpSession) func([]byte) {
	if sess.sendDown == nil {
		client, control := sess.client, sess.replyControl()
		sess.sendDown = func(b []byte) { s.writeToClient(b, control, client) }
	}
	return sess.sendDown
}

// relayLoop waits on the service socket and every backend socket, relays
// what arrives, and closes sessions idle for udpIdleTimeout when the
// poller's deadline (the oldest session's expiry) passes.
func (s *udpProxySocket) relayLoop() {
	for {
		n, err := s.poller.wait()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.deadlinePassed()
			continue
		}
		if err != nil {
			return // closed
		}
		s.relayReady(n)
	}
}

// relayReady relays from the first n sockets of the poller's events, in a
// batch taken from udpBatches for this wake-up only: the replies of every
// ready backend socket leave in one sendmmsg per udpBatchLen.
func (s *udpProxySocket) relayReady(n int) {
	if n == 0 {
		return
	}
	b := getUDPBatch()
	s.batch = b
	for _, ev := range s.poller.events[:n] {
		if int(ev.Fd) == s.serviceFD {
			s.flushReplies() // the drain reads into every slot
			_ = s.serviceRaw.Control(s.drainFn)
			continue
		}
		if ev.Events&unix.EPOLLERR != 0 {
			// An ICMP error about the session's datagrams (read only
			// now: the datagrams that err nothing pay nothing).
			s.sessionErrors(int(ev.Fd))
		}
		s.relayFrom(int(ev.Fd), b)
		if b.used == udpBatchLen {
			s.flushReplies()
		}
	}
	s.flushReplies()
	s.groReads, b.groReads = s.groReads+b.groReads, 0
	s.batch = nil
	putUDPBatch(b)
}

// deadlinePassed relays the replies already waiting, then expires idle
// sessions. Once the deadline has passed, wait reports it before any ready
// socket, so a reply that arrived in time but was not read yet (this loop
// ran late, on a loaded node) would otherwise be closed with its session.
func (s *udpProxySocket) deadlinePassed() {
	s.relayReady(s.poller.ready())
	s.expireIdle()
}
