package proxier

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// A UDP session's datagrams leave its backend socket as new packets, at the
// node's default TTL (hop limit), whatever the client's had left. An
// endpoint at another node's NodePort whose proxy sends the datagram back
// here (a selectorless Service pointed at the nodes' NodePorts of itself)
// was a loop nothing ended: one datagram went round, a new session per hop
// on each node, until a proxy restarted. kube-proxy forwards such a packet,
// and its TTL ends the loop. So the service socket asks for each
// datagram's TTL (IP_RECVTTL, IPV6_RECVHOPLIMIT), and the datagram that
// opens a session sets its backend socket's to one less, as a router
// forwarding it would; with one left it is dropped (errHopLimitExceeded).
// Local delivery (the portal's REDIRECT or DNAT) does not decrement, so a
// loop between two nodes on one link lowers it only by this: each node's
// backend datagrams leave one below what came in, a pod's at 63 where they
// left at 64 before, as after kube-proxy's forwarding. A session's later
// datagrams go with the TTL its first one set.

// errHopLimitExceeded: the datagram opening a session had one hop left, so
// it is dropped here, as a router drops it.
var errHopLimitExceeded = errors.New("the datagram's TTL (hop limit) ran out at this proxy, as a router's would: a forwarding loop through another node (an endpoint at another node's NodePort or Service address whose proxy sends it back here)")

// hopLimitSpace is the room for a datagram's TTL or hop limit control
// message (one of them: an IPv4 datagram on a dual-stack socket reports
// only its TTL).
var hopLimitSpace = unix.CmsgSpace(4)

// enableHopLimits asks the kernel for each datagram's TTL on the service
// socket fd of family (and, on an IPv6 socket, for each IPv6 datagram's
// hop limit) and reports whether it took both.
func enableHopLimits(fd, family int) bool {
	if unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVTTL, 1) != nil {
		return false
	}
	if family == unix.AF_INET6 {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1) == nil
	}
	return true
}

// hopLimit is the TTL or hop limit the datagram whose control messages are
// oob arrived with, 0 when they report none.
func hopLimit(oob []byte) int {
	for len(oob) >= unix.CmsgLen(0) {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			return 0
		}
		if len(data) >= 4 && (h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TTL ||
			h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_HOPLIMIT) {
			return int(*(*int32)(unsafe.Pointer(&data[0])))
		}
		oob = rest
	}
	return 0
}

// setHopLimit sets the TTL (v4) or hop limit of the datagrams the backend
// socket fd sends.
func setHopLimit(fd int, v4 bool, hops int) error {
	if v4 {
		return rawio.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TTL, hops)
	}
	return rawio.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, hops)
}
