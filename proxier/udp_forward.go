package proxier

import (
	"errors"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

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
	// An EMSGSIZE that a send after a packet too big's does not clear is
	// the kernel's refusal of GSO. A protocol unreachable (ENOPROTOOPT)
	// or a source route failed (EOPNOTSUPP) is also an errno of its
	// refusals, and was taken for one when the send took it as the
	// socket's pending error: GSO to backends went off for the socket
	// for good.
	_, ended, err := s.sendSessionLocked(sess, func(fd int) (int, error) { return 0, b.sendRun(fd, i, g) })
	if ended {
		// The endpoint is unreachable: this datagram is lost and the
		// next ones pick again, as after a refusal.
		if b.seg[i] == 0 {
			return i + 1
		}
		return i
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
	if err == errSessionLimit {
		// The total cap, and another port holds more sessions, or this
		// one has none idle: another port's, taken without this port's
		// mutex (roomFromOtherPorts).
		s.mu.Unlock()
		given := s.roomFromOtherPorts(now)
		s.mu.Lock()
		if given {
			s.takeGivenSlotLocked()
			sess, err = s.sessionLocked(client, oob, now)
		}
	}
	if err != nil {
		s.mu.Unlock()
		if errors.Is(err, net.ErrClosed) {
			// Read as the port closed: no endpoint failed and no
			// client is refused (a datagram a moment later finds no
			// socket at all).
			return
		}
		if errors.Is(err, errSessionLimit) {
			s.noBackend.report(s.label, client, err)
			s.capDropped.Inc()
			return
		}
		s.failed.Inc()
		s.noBackend.report(s.label, client, err)
		if errors.Is(err, loadbalancer.ErrNoEndpoints) {
			s.cfg.unreachable.send(client, oob, s.bound, b)
		}
		return
	}
	s.sessions.touch(sess, now)
	sess.bytesIn += int64(len(b))
	if plan == nil {
		_, err := s.writeSessionLocked(sess, b)
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
		if !s.shut { // else perhaps another socket's session now (handed over)
			sess.deferredUntil = max(sess.deferredUntil, mono.Add(now, d))
			sess.upDeferredUntil = max(sess.upDeferredUntil, mono.Add(now, d))
		}
		s.mu.Unlock()
	}
}

// writeSessionLocked writes one datagram to the session's backend
// (sendSessionLocked).
func (s *udpProxySocket) writeSessionLocked(sess *udpSession, b []byte) (int, error) {
	n, _, err := s.sendSessionLocked(sess, func(fd int) (int, error) { return rawio.Write(fd, b) })
	return n, err
}

// sendSessionLocked sends on the session's backend socket with send, one
// datagram or a GSO buffer, and tells whether an error it took ended the
// session. A send may take the socket's pending error from an ICMP error
// about the session's datagrams (the kernel reports it at the next send or
// read on the connected socket) and then sent nothing:
//   - EMSGSIZE, from a packet too big for the path: the path MTU is known by
//     now, so the data goes once more, fragmented if need be;
//   - another ICMP error's (icmpErrno: IP_RECVERR makes every one the
//     socket's error, a time exceeded too): the error queue is read as on
//     EPOLLERR, and an unreachable endpoint ends the session there, while
//     after one passed over the data goes once more, a few times (another
//     error can come between the look and the send: a flood of them,
//     forged). It was lost, and with it the client's answer (its session
//     idled out while the client waited).
//
// A refusal (ECONNREFUSED) is the caller's. send is called here only, so
// a caller's closure stays on its stack: no allocation per datagram.
func (s *udpProxySocket) sendSessionLocked(sess *udpSession, send func(fd int) (int, error)) (n int, ended bool, err error) {
	n, err = sendPastPacketTooBig(sess.fd, send)
	for range 3 {
		if !icmpErrno(err) {
			break
		}
		if s.sessionErrorsLocked(sess) {
			return n, true, err
		}
		n, err = sendPastPacketTooBig(sess.fd, send)
	}
	return n, false, err
}

// sendPastPacketTooBig sends with send on fd, once more after an EMSGSIZE
// (sendSessionLocked).
func sendPastPacketTooBig(fd int, send func(fd int) (int, error)) (int, error) {
	n, err := send(fd)
	if errors.Is(err, unix.EMSGSIZE) {
		n, err = send(fd)
	}
	return n, err
}
