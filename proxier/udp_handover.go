package proxier

import (
	"cmp"
	"slices"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// A UDP proxy socket that closes for another socket of its service port to
// take its place (a reopen: the Service became dual-stack, an unnamed
// port's number changed, its port is now a node port; a retired external
// socket: the traffic policy no longer splits the port) hands its live
// sessions to that socket, so a client that keeps its source port (a QUIC
// connection, a game, a resolver) stays on its endpoint, as kube-proxy's
// conntrack entry keeps it across any rule change. Closed with the old
// socket, they were lost: the client's next datagram picked again, and an
// ongoing flow moved to another endpoint mid-stream.
//
// The table moves whole: the old socket, under its own mutex, is shut and
// gives it up before its service socket and epoll set close (the backend
// sockets stay open, in no epoll set); the new one, under its own, adds
// each session and its descriptor to its own set. A client datagram is
// read from one service socket or the other, a backend socket is in one
// epoll set and one table at a time, so nothing is relayed twice, and a
// session keeps its backend while the new socket's balancer entry still
// serves it (its next datagram checks). No lock is shared and the
// per-datagram path is unchanged.

// handedSessions is the session table a UDP proxy socket gave up as it
// closed (closeHandingOver), for a socket of the same service port to
// adopt, or to close (closeHanded).
type handedSessions struct {
	from  *udpProxySocket
	table udpSessionTable
}

// closeHandingOver closes the socket as Close does, but for its sessions:
// their backend sockets stay open and are returned, nil when it was closed
// already. The socket's relay loop finds no session afterwards; a datagram a
// fault still holds for it is dropped (the socket is shut).
func (s *udpProxySocket) closeHandingOver() (*handedSessions, error) {
	var h *handedSessions
	err := s.closeWith(func() error {
		err := s.conn.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.shut = true
		h = &handedSessions{from: s, table: s.sessions}
		s.sessions = newUDPSessionTable()
		s.held.Store(0)
		s.returnGivenSlotLocked()
		s.cfg.conns.removeUDPSocket(s)
		_ = s.poller.close() // the backend sockets leave its set
		return err
	})
	return h, err
}

// handOver closes sock, handing its sessions over when it is a UDP socket.
func handOver(sock proxySocket) (*handedSessions, error) {
	if u, ok := sock.(*udpProxySocket); ok {
		return u.closeHandingOver()
	}
	return nil, sock.Close()
}

// list is h's sessions, oldest first.
func (h *handedSessions) list() []*udpSession {
	if h == nil {
		return nil
	}
	var out []*udpSession
	h.table.each(func(sess *udpSession) { out = append(out, sess) })
	h.table = newUDPSessionTable()
	return out
}

// closeHanded closes the sessions of hs no socket adopted.
func closeHanded(hs ...*handedSessions) {
	for _, h := range hs {
		for _, sess := range h.list() {
			h.from.endHandedSession(sess)
		}
	}
}

// endHandedSession closes a handed session no socket took.
func (s *udpProxySocket) endHandedSession(sess *udpSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endSessionLocked(sess)
}

// adopt takes the sessions of hs as its own (sock: the adopting socket; a
// socket of another protocol closes them). Called before Start for a
// reopened socket, when nothing else can have opened a session yet, or
// on a running one (a retired socket's sessions): a client that has a
// session here already keeps it, the handed one closes. A session whose
// client this socket cannot address (an IPv6 client of a socket reopened
// in IPv4 only) closes too. Each starts a new idle period. The socket
// keeps its --udp-max-sessions-per-port: the oldest handed sessions beyond
// it close, counted as evicted, as a new client's first datagram at the
// cap closes the port's oldest (none holds a datagram a fault delays for
// this socket: the old socket, shut, drops those).
func adopt(sock proxySocket, hs ...*handedSessions) {
	s, ok := sock.(*udpProxySocket)
	if !ok {
		closeHanded(hs...)
		return
	}
	var handed []handedSession
	for _, h := range hs {
		for _, sess := range h.list() {
			handed = append(handed, handedSession{sess, h.from})
		}
	}
	// Oldest first across the tables, so that the newest are kept.
	slices.SortStableFunc(handed, func(a, b handedSession) int { return cmp.Compare(a.sess.lastActive, b.sess.lastActive) })
	var refused []handedSession
	var adopted []*udpSession
	s.mu.Lock()
	now := mono.Now()
	wasEmpty := s.sessions.len() == 0
	for _, hd := range handed {
		sess := hd.sess
		if s.shut || s.sessions.get(sess.client) != nil || s.bound.Addr().Unmap().Is4() && !sess.client.Addr().Is4() ||
			s.poller.add(sess.fd) != nil {
			refused = append(refused, hd)
			continue
		}
		sess.generation = recheckGeneration // the old socket's count is not this entry's
		// And expireIdle checks it, as useBalancer's: else only the
		// client's next datagram did, and its endpoint's replies kept
		// a session this socket's balancer does not serve open.
		s.checkedGeneration = recheckGeneration
		// Built anew by this socket: the old ones write through the
		// old one (and check its shut).
		sess.sendUp, sess.sendDown = nil, nil
		s.sessions.add(sess, now)
		adopted = append(adopted, sess)
	}
	over := min(s.sessions.len()-s.cfg.udpMaxSessionsPerPort, len(adopted))
	for _, sess := range adopted[:max(over, 0)] {
		s.closeSessionLocked(sess)
		s.evicted.Inc()
	}
	s.held.Store(int64(s.sessions.len()))
	if wasEmpty && s.sessions.len() > 0 {
		s.poller.setDeadline(mono.Time(s.idleAt(now)))
	}
	s.mu.Unlock()
	for _, hd := range refused {
		hd.from.endHandedSession(hd.sess)
	}
}

// handedSession is a session adopt takes, and the socket that gave it up.
type handedSession struct {
	sess *udpSession
	from *udpProxySocket
}

// succession is what a socket closed to reopen (closeForReopen) leaves the
// socket that replaces it: a UDP socket itself, set aside and serving on
// until the new one binds (closeOld, called just before the bind), so
// that its clients meet a closed port only between the two system calls
// (closed where the reopen began, 65 µs to 1.1 ms before the bind, its
// connected clients got ECONNREFUSED from the kernel's port unreachable:
// 3 in 6 reopens at 500 datagrams/s); and the sessions of it and of any
// socket closed for it, for the new socket to adopt (adoptBy) or, if
// none opens, to close (abandon). A TCP socket closes at once (its
// connections outlive it). The sync's goroutine owns it.
type succession struct {
	name   loadbalancer.ServicePortName
	old    proxySocket // nil once closed
	handed []*handedSessions
}

// setAside returns the succession of sock, which a reopen replaces.
func setAside(name loadbalancer.ServicePortName, sock proxySocket) *succession {
	s := &succession{name: name}
	if _, ok := sock.(*udpProxySocket); ok {
		s.old = sock
	} else {
		s.closeWith(sock)
	}
	return s
}

// closeWith closes sock now, its UDP sessions handed to the successor.
func (s *succession) closeWith(sock proxySocket) {
	h, err := handOver(sock)
	if err != nil {
		klog.ErrorS(err, "Closing proxy socket", "servicePort", s.name)
	}
	if h != nil {
		s.handed = append(s.handed, h)
	}
}

// closeOld closes the socket set aside, if it is still open.
func (s *succession) closeOld() {
	if s == nil || s.old == nil {
		return
	}
	old := s.old
	s.old = nil
	s.closeWith(old)
}

// adoptBy closes the old socket, if still open, and hands its sessions to
// sock.
func (s *succession) adoptBy(sock proxySocket) {
	if s == nil {
		return
	}
	s.closeOld()
	adopt(sock, s.handed...)
	s.handed = nil
}

// abandon closes the old socket, if still open, and the sessions no socket
// adopts.
func (s *succession) abandon() {
	if s == nil {
		return
	}
	s.closeOld()
	closeHanded(s.handed...)
	s.handed = nil
}
