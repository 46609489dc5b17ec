package proxier

import (
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// repliesPerWake bounds how many replies one session relays per wake-up,
// so one busy backend cannot starve the port's other sessions.
const repliesPerWake = 16

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
				s.writeEach(b, k)
			}
		case b.isGSO(k) && gsoRefused(err):
			if b.beyondOwnRuns(b.first[k]) {
				// Refused for the GRO read's own shape (see
				// forwardGSO): only these go one by one.
			} else if !s.noGSO {
				klog.V(2).InfoS("UDP GSO refused: replies leave one datagram per message", "servicePort", s.label, "err", err)
				s.noGSO = true
			}
			s.writeEach(b, k)
			k++
		default:
			klog.V(3).InfoS("UDP write to client failed", "servicePort", s.label, "client", b.to[k], "err", err)
			k++
		}
	}
	b.dropReplies()
	s.bytesOut.Add(float64(sent))
}

// writeEach writes the datagrams of queued message k one by one
// (writeToClient).
func (s *udpProxySocket) writeEach(b *udpBatch, k int) {
	for i := b.first[k]; i < b.first[k]+b.count[k]; i++ {
		for off := 0; off >= 0; {
			var d []byte
			d, off = b.datagramAt(i, off)
			s.writeToClient(d, b.replyControl[k], b.to[k])
		}
	}
}

// writeToClient writes one datagram to client through the service socket
// with the net package (waiting for room), counts its bytes, and logs a
// failure at -v=3 (the datagram is dropped).
func (s *udpProxySocket) writeToClient(d, control []byte, client netip.AddrPort) {
	if m, _, err := s.conn.WriteMsgUDPAddrPort(d, control, client); err == nil {
		s.bytesOut.Add(float64(m))
	} else {
		klog.V(3).InfoS("UDP write to client failed", "servicePort", s.label, "client", client, "err", err)
	}
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

// receiveFailedLocked handles a failed receive on sess's backend socket:
// the endpoint refused (the session ends as refusedLocked's), a packet too
// big (kept), an ICMP error that came after the poller looked (handled as
// on EPOLLERR), or a broken socket (the session ends); nothing for a
// receive that found nothing to read (EAGAIN, EINTR).
func (s *udpProxySocket) receiveFailedLocked(sess *udpSession, err error) {
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
		// An ICMP error that came after the poller looked (the
		// socket's pending error, which a receive reports first):
		// the client is told as on EPOLLERR, and one passed over
		// there (a time exceeded) keeps the session here too; a
		// reply waiting is read at the next wake. It closed the
		// session, silently, with the reply on it, so forged time
		// exceeded errors closed busy sessions. Else broken: end the
		// session; the client's next datagram picks again.
		if !s.sessionErrorsLocked(sess) && !icmpErrno(err) {
			s.closeSessionLocked(sess)
		}
	}
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
		s.receiveFailedLocked(sess, err)
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
	client, control := sess.client, sess.replyControl()
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
			} else {
				s.writeToClient(d, control, client)
			}
		}
	}
	if deferred > 0 {
		// A delayed reply keeps the session as a delayed request does
		// (the client's next datagram finds its backend), unless replies
		// no longer keep it (removed).
		s.mu.Lock()
		if !s.shut && sess.fd >= 0 && !sess.removed {
			sess.deferredUntil = max(sess.deferredUntil, mono.Add(now, deferred))
		}
		s.mu.Unlock()
	}
}
