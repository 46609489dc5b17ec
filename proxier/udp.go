package proxier

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// repliesPerWake bounds how many replies one session relays per wake-up,
// so one busy backend cannot starve the port's other sessions.
const repliesPerWake = 16

// errSessionLimit: the total cap is reached and this port has no session of
// its own to give up.
var errSessionLimit = errors.New("UDP session limit reached")

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
	droppedNoBackend                *counter
	evicted, refused                *counter

	// mu guards sessions and every system call on a backend descriptor, so
	// that none is used after close. Per socket, never global.
	mu       sync.Mutex
	sessions udpSessionTable
	poller   *udpPoller
	shut     bool // closed: no new session
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
		droppedNoBackend:     &m.failed,
		evicted:              &m.udpEvicted,
		refused:              &m.udpDropped,
	}
	if withDst {
		s.oobLen = pktinfoSpace
	}
	s.drainFn = s.drain
	s.sendRepliesFn = s.sendReplies
	cfg.conns.addUDPSocket(s)
	return s, nil
}

func (s *udpProxySocket) Port() int { return s.conn.LocalAddr().(*net.UDPAddr).Port }

// Close closes the service socket and every session at once.
func (s *udpProxySocket) Close() error {
	return s.closeWith(func() error {
		err := s.conn.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.shut = true
		s.sessions.each(s.closeSessionLocked)
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

// serviceBatch bounds the client datagrams one wake-up relays, so a flood
// on the service socket leaves room for the replies of the same wake-up
// (the poller is level-triggered: what is left is reported again at once).
const serviceBatch = 256

// drain relays up to serviceBatch datagrams queued on the service socket
// fd, read udpBatchLen at a time into the wake-up's batch (whose slots hold
// no reply: sendReplies ran first).
func (s *udpProxySocket) drain(fd uintptr) {
	b := s.batch
	for relayed := 0; relayed < serviceBatch; {
		select {
		case <-s.closed:
			return
		default:
		}
		n, err := b.recv(int(fd), 0, udpBatchLen, true, s.oobLen)
		switch err {
		case nil:
		case unix.EAGAIN:
			return
		case unix.EINTR:
			continue
		default:
			klog.V(2).InfoS("UDP read failed", "servicePort", s.label, "err", err)
			relayed++
			continue
		}
		// Each source is decoded once: a run ends at the first datagram
		// from another client, which starts the next.
		from := b.source(0)
		for i := 0; i < n; {
			j, next := i+1, netip.AddrPort{}
			for ; j < n; j++ {
				if next = b.source(j); s.noGSOUp || next != from {
					break
				}
			}
			s.forwardRun(from, b, i, j)
			i, from = j, next
		}
		if n < udpBatchLen {
			return // the queue is empty: no read just to be told so
		}
		relayed += n
	}
}

// forwardRun sends datagrams from one client, slots [i, j) of b, to its
// backend: runs of one size, and GRO reads, as one GSO buffer each (one
// pass through the stack, cut into the datagrams they were). Faulted
// datagrams, a single one, and what a GSO send did not take go through
// forward one by one; a run after them is a GSO buffer again (a QUIC
// client's small datagram before its next burst, the first datagram of
// a new session).
func (s *udpProxySocket) forwardRun(client netip.AddrPort, b *udpBatch, i, j int) {
	gso := s.datagramFaults() == nil
	for i < j {
		if gso && !s.noGSOUp {
			if g := b.runEnd(i, j); g > i+1 || b.seg[i] > 0 {
				if next := s.forwardGSO(client, b, i, g); next > i {
					i = next
					continue
				}
			}
		}
		for off := 0; off >= 0; {
			var d []byte
			d, off = b.datagramAt(i, off)
			s.forward(client, d, b.controlMessages(i))
		}
		i++
	}
}

// forwardGSO sends slots [i, g) from client, a run runEnd found or one
// GRO read, as one GSO buffer, and returns the first slot it did not send:
// g once sent, i when forward must take the slots one by one (a new
// session, a re-check, GSO refused; a refusal of the kernel's for GSO
// itself turns it off for this socket's backends).
func (s *udpProxySocket) forwardGSO(client netip.AddrPort, b *udpBatch, i, g int) int {
	now := mono.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions.get(client)
	if sess == nil || sess.generation != s.sp.Generation() {
		return i // a new session, or a re-check: forward opens or checks it
	}
	err := b.sendRun(sess.fd, i, g)
	if errors.Is(err, unix.EMSGSIZE) {
		// Perhaps the socket's error from an ICMP packet too big (see
		// writeBackend), which the send took instead of the buffer: once
		// more, and only then is EMSGSIZE the kernel's refusal of GSO.
		err = b.sendRun(sess.fd, i, g)
	}
	if err != nil {
		switch {
		case errors.Is(err, unix.ECONNREFUSED):
			// As forward: the backend's port is closed, this datagram
			// is lost and the next one picks again. (The refusal sent
			// nothing: a GRO read's datagrams all go on, one by one,
			// the first opening the new session.)
			s.refusedLocked(sess, err)
			if b.seg[i] == 0 {
				return i + 1
			}
		case gsoRefused(err) && b.beyondOwnRuns(i):
			// Refused for the GRO read's own shape (the path to the
			// backend takes less than the client's did): these go one
			// by one, GSO stays on.
		case gsoRefused(err):
			klog.V(2).InfoS("UDP GSO refused: datagrams go to backends one by one", "servicePort", s.label, "err", err)
			s.noGSOUp = true
		}
		return i
	}
	var sent int64
	for x := i; x < g; x++ {
		sent += int64(b.size[x])
	}
	s.gsoSendsUp++
	if sess.fd >= 0 {
		s.sessions.touch(sess, now)
	}
	sess.bytesIn += sent
	s.bytesIn.Add(float64(sent))
	return g
}

// forward sends one client datagram to the client's backend.
func (s *udpProxySocket) forward(client netip.AddrPort, b, oob []byte) {
	now := mono.Now()
	plan := s.datagramFaults()
	s.mu.Lock()
	sess, err := s.sessionLocked(client, oob, now)
	if err != nil {
		s.mu.Unlock()
		if errors.Is(err, errSessionLimit) {
			s.refused.Inc()
			return
		}
		s.droppedNoBackend.Inc()
		s.noBackend.report(s.label, client, err)
		if errors.Is(err, loadbalancer.ErrNoEndpoints) {
			s.cfg.unreachable.send(client, oob, s.bound, b)
		}
		return
	}
	s.sessions.touch(sess, now)
	sess.bytesIn += int64(len(b))
	if plan == nil {
		_, err := writeBackend(sess.fd, b)
		if errors.Is(err, unix.ECONNREFUSED) {
			// The backend's port is closed (an earlier ICMP error): the
			// client's next datagram picks again.
			s.refusedLocked(sess, err)
		}
		s.mu.Unlock()
		if err != nil {
			klog.V(3).InfoS("UDP write to backend failed", "servicePort", s.label, "client", client, "err", err)
			return
		}
		s.bytesIn.Add(float64(len(b)))
		return
	}
	send := s.upSenderLocked(sess)
	s.mu.Unlock()
	// bytes_total counts what send delivers: a lost datagram is not
	// proxied, a duplicated one twice.
	if d := plan.Send(faults.StreamUp, client, b, send); d > 0 {
		// From now, taken before Send: the datagram is due no earlier, so
		// its send (which touches the session) is never before this.
		s.mu.Lock()
		sess.deferredUntil = max(sess.deferredUntil, mono.Add(now, d))
		s.mu.Unlock()
	}
}

// writeBackend writes one datagram to a session's backend socket. An
// EMSGSIZE may be the socket's pending error from an ICMP packet too big
// for the path (the kernel reports it at the next send or read on the
// connected socket, and this send then sent nothing): the path MTU is
// known by now, so the datagram goes once more, fragmented if need be.
func writeBackend(fd int, b []byte) (int, error) {
	n, err := rawio.Write(fd, b)
	if errors.Is(err, unix.EMSGSIZE) {
		n, err = rawio.Write(fd, b)
	}
	return n, err
}

// sessionLocked returns the client's session, opening one (and making room
// for it) on the client's first datagram or when its backend is no longer
// an endpoint.
func (s *udpProxySocket) sessionLocked(client netip.AddrPort, oob []byte, now int64) (*udpSession, error) {
	generation := s.sp.Generation()
	if sess := s.sessions.get(client); sess != nil {
		if sess.generation == generation {
			return sess, nil
		}
		if s.sp.Serves(sess.backend) {
			sess.generation, sess.removed = generation, false
			return sess, nil
		}
		// The endpoint is gone: re-balance now, as kube-proxy deletes the
		// conntrack entries of a removed UDP endpoint.
		s.closeSessionLocked(sess)
	}
	if s.shut {
		return nil, net.ErrClosed
	}
	if err := s.makeRoomLocked(); err != nil {
		return nil, err
	}
	var lastErr error
	for i := range s.cfg.dialTimeouts {
		ep, err := s.sp.Next(client.Addr(), i > 0)
		if err != nil {
			lastErr = err
			break
		}
		fd, err := dialUDPBackend(ep)
		if err == nil {
			if err = s.poller.add(fd); err != nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			lastErr = err
			if relay.LocalShortage(err) {
				break // no endpoint's fault, and the next would fail alike
			}
			s.dialFailures.Inc()
			continue
		}
		sess := &udpSession{client: client, backend: ep, local: datagramDestination(oob, s.bound), fd: fd, generation: generation, started: time.Now().UnixNano()}
		if s.replyFromDestination {
			sess.replyControl = replyControl(oob)
		}
		s.sessions.add(sess, now)
		s.sessionsGauge.Inc()
		if s.sessions.len() == 1 {
			s.poller.setDeadline(mono.Time(s.idleAt(now)))
		}
		return sess, nil
	}
	s.cfg.udpBudget.release()
	return nil, lastErr
}

// makeRoomLocked takes a slot for one more session: at the port's cap, or
// at the total cap, the port's oldest idle session gives up its own.
func (s *udpProxySocket) makeRoomLocked() error {
	if s.sessions.len() >= s.cfg.udpMaxSessionsPerPort && s.sessions.oldest != nil {
		s.closeSessionLocked(s.sessions.oldest)
		s.evicted.Inc()
	}
	if s.cfg.udpBudget.acquire() {
		return nil
	}
	if s.sessions.oldest == nil {
		return errSessionLimit
	}
	s.closeSessionLocked(s.sessions.oldest)
	s.evicted.Inc()
	if !s.cfg.udpBudget.acquire() { // another port took the slot meanwhile
		return errSessionLimit
	}
	return nil
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
	s.dialFailures.Inc()
	s.cfg.unreachable.endpointRefused(sess.client, sess.local)
	// With ClientIP affinity the client is pinned to the endpoint that
	// refused: its next datagram must not find the pin again.
	s.sp.Failed(sess.client.Addr(), sess.backend)
	klog.V(2).InfoS("UDP endpoint refused the session's datagrams; the client's next datagram picks again",
		"servicePort", s.label, "client", sess.client, "endpoint", sess.backend, "err", err)
	s.closeSessionLocked(sess)
}

func (s *udpProxySocket) closeSessionLocked(sess *udpSession) {
	s.sessions.remove(sess)
	logUDPSessionEnd(s, sess)
	unix.Close(sess.fd)
	sess.fd = -1
	s.cfg.udpBudget.release()
	s.sessionsGauge.Dec()
}

// upSenderLocked returns the function that delivers a faulted datagram to
// the session's backend, if the session is still open by then.
func (s *udpProxySocket) upSenderLocked(sess *udpSession) func([]byte) {
	if sess.sendUp == nil {
		sess.sendUp = func(b []byte) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if sess.fd >= 0 {
				if n, err := writeBackend(sess.fd, b); err == nil {
					s.bytesIn.Add(float64(n))
				}
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
		client, control := sess.client, sess.replyControl
		sess.sendDown = func(b []byte) {
			if m, _, err := s.conn.WriteMsgUDPAddrPort(b, control, client); err == nil {
				s.bytesOut.Add(float64(m))
			}
		}
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

// flushReplies sends the replies queued in the wake-up's batch.
func (s *udpProxySocket) flushReplies() {
	if s.batch.queued == 0 {
		return
	}
	if err := s.serviceRaw.Control(s.sendRepliesFn); err != nil {
		s.batch.dropReplies() // closed: the replies go nowhere
	}
}

// sendReplies sends the batch's queued replies through the service socket
// fd with sendmmsg. A reply the kernel refuses is dropped, as a single
// write's error drops it; a GSO buffer it refuses is sent again one
// datagram at a time, and GSO is off for the socket from then on. When the
// socket's send buffer is full (EAGAIN), the rest go one by one through
// the net package, which waits for room as the per-reply writes always
// did.
func (s *udpProxySocket) sendReplies(fd uintptr) {
	b := s.batch
	var sent int64
	for k := 0; k < b.queued; {
		n, err := rawio.Sendmmsg(int(fd), b.msgs[k:b.queued])
		for i := k; i < k+n; i++ {
			sent += int64(b.msgs[i].Len)
			if b.isGSO(i) {
				s.gsoSends++
			}
		}
		k += n
		switch {
		case err == nil || err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			for ; k < b.queued; k++ {
				sent += s.writeEach(b, k)
			}
		case b.isGSO(k) && gsoRefused(err):
			if b.beyondOwnRuns(b.first[k]) {
				// Refused for the GRO read's own shape (see
				// forwardGSO): only these go one by one.
			} else if !s.noGSO {
				klog.V(2).InfoS("UDP GSO refused: replies leave one datagram per message", "servicePort", s.label, "err", err)
				s.noGSO = true
			}
			sent += s.writeEach(b, k)
			k++
		default:
			klog.V(3).InfoS("UDP write to client failed", "servicePort", s.label, "client", b.to[k], "err", err)
			k++
		}
	}
	b.dropReplies()
	s.bytesOut.Add(float64(sent))
}

// writeEach writes the datagrams of queued message k one by one through
// the net package (waiting for room) and returns the bytes written.
func (s *udpProxySocket) writeEach(b *udpBatch, k int) int64 {
	var sent int64
	for i := b.first[k]; i < b.first[k]+b.count[k]; i++ {
		for off := 0; off >= 0; {
			var d []byte
			d, off = b.datagramAt(i, off)
			if m, _, err := s.conn.WriteMsgUDPAddrPort(d, b.replyControl[k], b.to[k]); err == nil {
				sent += int64(m)
			} else {
				klog.V(3).InfoS("UDP write to client failed", "servicePort", s.label, "client", b.to[k], "err", err)
			}
		}
	}
	return sent
}

// gsoRefused tells the errors of a GSO send the kernel cannot make on
// this socket or route from those of the datagrams themselves.
func gsoRefused(err error) bool {
	switch err {
	case unix.EIO, unix.EINVAL, unix.EMSGSIZE, unix.ENOPROTOOPT, unix.EOPNOTSUPP:
		return true
	}
	return false
}

// deadlinePassed relays the replies already waiting, then expires idle
// sessions. Once the deadline has passed, wait reports it before any ready
// socket, so a reply that arrived in time but was not read yet (this loop
// ran late, on a loaded node) would otherwise be closed with its session.
func (s *udpProxySocket) deadlinePassed() {
	s.relayReady(s.poller.ready())
	s.expireIdle()
}

// relayFrom reads up to repliesPerWake datagrams waiting on one backend
// socket (as many as the batch has room for) with one recvmmsg and queues
// them for the client; faulted replies go through their plan at once.
func (s *udpProxySocket) relayFrom(fd int, b *udpBatch) {
	s.mu.Lock()
	sess := s.sessions.getFD(fd)
	if sess == nil {
		s.mu.Unlock()
		return
	}
	first := b.used
	n, err := b.recv(fd, first, min(repliesPerWake, udpBatchLen-first), false, groSpace)
	if err != nil {
		switch {
		case err == unix.ECONNREFUSED:
			s.refusedLocked(sess, err)
		case err == unix.EMSGSIZE:
			// An ICMP packet too big (fragmentation needed) for the path
			// to the backend, reported once as the socket's error: the
			// kernel keeps the path MTU and fragments what follows, so
			// the session is sound (closed, its client moved to another
			// endpoint mid-flow and the replies on their way were lost).
			// A reply queued meanwhile is read at the next wake.
		case err != unix.EAGAIN && err != unix.EINTR:
			// Broken: end the session; the client's next datagram
			// picks again.
			s.closeSessionLocked(sess)
		}
		s.mu.Unlock()
		return
	}
	now := mono.Now()
	if !sess.removed {
		s.sessions.touch(sess, now)
	}
	if n > 1 && !sess.gro {
		// Replies come in bursts: take those a GSO sender or a NIC's GRO
		// keeps together as one read from now on. Not asked per session
		// up front: a DNS session (one reply) would pay a system call for
		// nothing.
		enableGRO(fd)
		growSessionReceiveBuffer(fd) // a burst may outgrow the default queue
		sess.gro = true              // asked once, taken or not
	}
	client, control := sess.client, sess.replyControl
	plan := s.datagramFaults()
	var send func([]byte)
	if plan != nil {
		send = s.downSenderLocked(sess)
	}
	for i := first; i < first+n; i++ {
		sess.bytesOut += int64(b.size[i])
	}
	s.mu.Unlock()
	if plan == nil && b.queueReplies(n, client, control, s.serviceFamily, !s.noGSO) {
		return
	}
	var deferred time.Duration
	for i := first; i < first+n; i++ {
		for off := 0; off >= 0; {
			var d []byte
			d, off = b.datagramAt(i, off)
			if plan != nil {
				deferred = max(deferred, plan.Send(faults.StreamDown, client, d, send)) // send counts bytes_total
			} else if m, _, err := s.conn.WriteMsgUDPAddrPort(d, control, client); err != nil {
				klog.V(3).InfoS("UDP write to client failed", "servicePort", s.label, "client", client, "err", err)
			} else {
				s.bytesOut.Add(float64(m))
			}
		}
	}
	if deferred > 0 {
		// A delayed reply keeps the session as a delayed request does
		// (the client's next datagram finds its backend), unless replies
		// no longer keep it (removed).
		s.mu.Lock()
		if sess.fd >= 0 && !sess.removed {
			sess.deferredUntil = max(sess.deferredUntil, mono.Add(now, deferred))
		}
		s.mu.Unlock()
	}
}

// expireIdle closes the sessions idle for udpIdleTimeout (no datagram
// either way and no delayed one pending) and marks those whose backend is
// no longer an endpoint as removed, then sets the next deadline. A removed
// session is not closed at once: a reply to a datagram sent just before
// the endpoint went away would be lost although its backend answered (the
// endpoint's process usually lives on while it terminates, or only left
// the Service). It idles out from the client's last datagram, replies do
// not extend it, and the client's next datagram re-balances.
func (s *udpProxySocket) expireIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shut {
		return
	}
	now := mono.Now()
	for old := s.sessions.oldest; old != nil && s.idleAt(old.lastActive) <= now; old = s.sessions.oldest {
		if s.idleAt(old.deferredUntil) > now {
			// A datagram a fault delayed is still to go out, or left less
			// than the idle timeout ago: its answer must find the session.
			// Re-touched only while the delay was ahead, the session lived
			// 0 to --udp-timeout after the datagram left, and a check
			// between its due time and the delay line's send closed the
			// session before the datagram could go out.
			s.sessions.touch(old, now)
			continue
		}
		s.closeSessionLocked(old)
	}
	if generation := s.sp.Generation(); generation != s.checkedGeneration {
		s.checkedGeneration = generation
		s.sessions.each(func(sess *udpSession) {
			if sess.generation == generation {
				return
			}
			if s.sp.Serves(sess.backend) {
				sess.generation, sess.removed = generation, false
				return
			}
			sess.removed = true
		})
	}
	if old := s.sessions.oldest; old != nil {
		s.poller.setDeadline(mono.Time(s.idleAt(old.lastActive)))
	} else {
		s.poller.setDeadline(time.Time{})
	}
}

// idleAt is when a session last active at lastActive idles out (mono.Now
// time). It saturates: a --udp-timeout near the largest duration ("never")
// wrapped into the past, and every session closed as it opened.
func (s *udpProxySocket) idleAt(lastActive int64) int64 {
	return mono.Add(lastActive, s.cfg.udpIdleTimeout)
}

// dialUDPBackend opens a non-blocking socket connected to ep. A raw
// descriptor, not a net.UDPConn: the reply loop polls it itself, and it
// costs no Go memory beyond the session.
func dialUDPBackend(ep netip.AddrPort) (int, error) {
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(ep.Port()), Addr: ep.Addr().As16()}
	if a := ep.Addr().Unmap(); a.Is4() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(ep.Port()), Addr: a.As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	if relay.InReserve(fd) {
		unix.Close(fd)
		return -1, relay.ErrDescriptorReserve
	}
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return -1, &net.OpError{Op: "dial", Net: "udp", Addr: net.UDPAddrFromAddrPort(ep), Err: os.NewSyscallError("connect", err)}
	}
	return fd, nil
}
