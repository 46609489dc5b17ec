package proxier

import (
	"encoding/binary"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// An endpoint the node cannot reach (a deleted pod's address that answers
// no ARP or neighbour solicitation: the node's own host unreachable; a
// route that ends in net unreachable; a firewall's admin-prohibited)
// sends the session's socket an ICMP destination unreachable that Linux
// counts as a soft error: without IP_RECVERR (IPV6_RECVERR) a connected
// UDP socket is never told, the session stayed, and its client waited out
// its timeouts, where through kube-proxy's DNAT the node's error reaches
// it (a resolver, glibc's, which sets IP_RECVERR, tries its next server
// at once). With the option every ICMP error about the session's
// datagrams is queued on the socket's error queue, which the poller
// reports as EPOLLERR (and keeps reporting until it is empty): it is read
// only then, so a datagram that errs nothing pays nothing but the option
// set once per session.

// enableRecvErr asks the kernel to queue every ICMP error about the
// datagrams of the session's socket fd of family. Best effort: without
// it the socket is told of hard errors (port unreachable) alone.
func enableRecvErr(fd, family int) {
	if family == unix.AF_INET {
		_ = rawio.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVERR, 1)
	} else {
		_ = rawio.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1)
	}
}

// icmpError is the ICMP destination unreachable a session's socket took.
type icmpError struct {
	v6         bool
	code       uint8
	errno      unix.Errno
	unreachErr bool // a destination unreachable (not a packet too big, time exceeded, ...)
}

// portUnreachable tells the endpoint's own refusal (its port is closed).
func (e icmpError) portUnreachable() bool {
	if e.v6 {
		return e.code == 4
	}
	return e.code == 3
}

// codeFor is the code of the destination unreachable the client is sent:
// the endpoint's own when the families agree, else host (address)
// unreachable.
func (e icmpError) codeFor(v6 bool) uint8 {
	switch {
	case e.v6 == v6:
		return e.code
	case v6:
		return 3 // address unreachable
	default:
		return 1 // host unreachable
	}
}

// sizeofSockExtendedErr is the size of struct sock_extended_err
// (linux/errqueue.h): errno, origin, type, code, pad, info, data.
const sizeofSockExtendedErr = 16

// errQueueDrain bounds the error messages one look reads off a socket; the
// poller reports the socket again while some are left.
const errQueueDrain = 64

// readErrQueue empties fd's error queue (it keeps the socket in error for
// the poller until then, and reading it clears the socket's pending error)
// and returns the first destination unreachable of an ICMP origin in it.
// Errors of a local origin, fragmentation needed (the kernel keeps the
// path MTU itself) and other ICMP types are read and passed over.
func readErrQueue(fd int) (first icmpError, ok bool) {
	var buf [1]byte
	var oob [128]byte
	for range errQueueDrain {
		_, oobn, _, _, err := unix.Recvmsg(fd, buf[:], oob[:], unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			break // EAGAIN: empty
		}
		if e := parseExtendedErr(oob[:oobn]); !ok && e.unreachErr {
			first, ok = e, true
		}
	}
	return first, ok
}

// parseExtendedErr reads the struct sock_extended_err of an error queue
// message's control data.
func parseExtendedErr(oob []byte) icmpError {
	for len(oob) >= unix.CmsgLen(0) {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			break
		}
		oob = rest
		if len(data) < sizeofSockExtendedErr {
			continue
		}
		v6 := h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_RECVERR
		if !v6 && (h.Level != unix.IPPROTO_IP || h.Type != unix.IP_RECVERR) {
			continue
		}
		e := icmpError{v6: v6, errno: unix.Errno(binary.NativeEndian.Uint32(data[0:4])), code: data[6]}
		origin, typ := data[4], data[5]
		switch {
		case origin == unix.SO_EE_ORIGIN_ICMP && typ == 3 && e.code != 4: // not fragmentation needed
			e.unreachErr = true
		case origin == unix.SO_EE_ORIGIN_ICMP6 && typ == 1:
			e.unreachErr = true
		}
		return e
	}
	return icmpError{}
}

// icmpErrno tells the errors an ICMP error about a session's datagrams
// makes its socket's pending error, which a receive or a send reports
// first (and so sends or receives nothing): with IP_RECVERR the kernel
// sets it for every ICMP error, soft ones too (a time exceeded:
// EHOSTUNREACH), and queues the error, which sessionErrorsLocked acts on
// or passes over (it may have read it already: the kernel queues the error
// before it sets the socket's, so a look at the queue can come between).
// Port unreachable (ECONNREFUSED) and fragmentation needed (EMSGSIZE) have
// their own handling.
func icmpErrno(err error) bool {
	switch err {
	case unix.EHOSTUNREACH, unix.ENETUNREACH, unix.EHOSTDOWN, unix.ENONET, unix.EACCES,
		unix.EPROTO, unix.ENOPROTOOPT, unix.EOPNOTSUPP:
		return true
	}
	return false
}

// sessionErrors acts on the errors queued on backend socket fd, which the
// poller reported in error.
func (s *udpProxySocket) sessionErrors(fd int) {
	s.mu.Lock()
	if sess := s.sessions.getFD(fd); sess != nil {
		s.sessionErrorsLocked(sess)
	}
	s.mu.Unlock()
}

// sessionErrorsLocked empties the session socket's error queue and, when
// it held a destination unreachable, ends the session as refused (port
// unreachable, as before) or unreachable, and says whether it did.
func (s *udpProxySocket) sessionErrorsLocked(sess *udpSession) bool {
	e, ok := readErrQueue(sess.fd)
	if !ok {
		return false
	}
	if e.portUnreachable() {
		s.refusedLocked(sess, unix.ECONNREFUSED)
	} else {
		s.endpointFailedLocked(sess, &e, e.errno)
	}
	return true
}
