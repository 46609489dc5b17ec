package proxier

import (
	"encoding/binary"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// A socket bound to the wildcard address replies from whatever source the
// route to the client prefers. On a node with several addresses that is not
// always the address the client's datagram was redirected to, and then
// conntrack cannot reverse the NAT and the reply is lost. So such a socket
// asks the kernel for each datagram's destination (IP_PKTINFO,
// IPV6_RECVPKTINFO) and each session replies from it.

// pktinfoSpace holds the destination control messages of one datagram (a
// dual-stack socket gets both kinds for an IPv4 datagram).
var pktinfoSpace = len(ipv4.NewControlMessage(ipv4.FlagDst)) + len(ipv6.NewControlMessage(ipv6.FlagDst))

// enableDestinationInfo turns the control messages on when conn listens on
// the wildcard address and reports whether it did.
func enableDestinationInfo(conn *net.UDPConn) (bool, error) {
	local := conn.LocalAddr().(*net.UDPAddr).IP
	if !local.IsUnspecified() {
		return false, nil // replies leave from the bound address anyway
	}
	if err := ipv4.NewPacketConn(conn).SetControlMessage(ipv4.FlagDst, true); err != nil {
		return false, err
	}
	if local.To4() == nil { // dual-stack: IPv6 clients too
		if err := ipv6.NewPacketConn(conn).SetControlMessage(ipv6.FlagDst, true); err != nil {
			return false, err
		}
	}
	return true, nil
}

// replyControlWords is room for the one control message of a reply, an
// IP_PKTINFO (32 bytes) or an IPV6_PKTINFO (40), in 64-bit words: the
// session keeps it in an array of them, so its header is aligned.
const replyControlWords = 5

// putReplyControl writes into dst, and returns, the control message that
// sends a reply from the destination reported in oob (datagramDestination
// reads it), nil when oob reports none. It is what x/net's ipv4 and ipv6
// ControlMessage.Marshal write, without their three allocations per new
// session (a socket bound to the wildcard address, the default), and what
// x/sys's unix.PktInfo4 and PktInfo6 write: those make and return their
// buffer and are not inlined, so even copied into dst each costs an
// allocation.
func putReplyControl(dst *[replyControlWords]uint64, oob []byte) []byte {
	d := datagramDestination(oob, netip.AddrPort{})
	if !d.IsValid() {
		return nil
	}
	*dst = [replyControlWords]uint64{}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 8*replyControlWords)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	addr := d.Addr()
	if addr.Is4() {
		h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
		h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
		info := (*unix.Inet4Pktinfo)(unsafe.Pointer(&b[unix.CmsgLen(0)]))
		info.Spec_dst = addr.As4()
		return b[:unix.CmsgSpace(unix.SizeofInet4Pktinfo)]
	}
	h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
	info := (*unix.Inet6Pktinfo)(unsafe.Pointer(&b[unix.CmsgLen(0)]))
	info.Addr = addr.As16()
	if addr.IsLinkLocalUnicast() {
		// A link-local source means nothing without its link: the
		// kernel refuses it (EINVAL) unless the reply names the
		// interface, the one the datagram came in on. A global source
		// leaves the interface to the route, as kube-proxy's replies
		// do: the arrival one is wrong under asymmetric routing.
		info.Ifindex = uint32(arrivalInterface(oob))
	}
	return b[:unix.CmsgSpace(unix.SizeofInet6Pktinfo)]
}

// arrivalInterface is the index of the interface an IPv6 datagram came in
// on, from its IPV6_PKTINFO in oob (0: none).
func arrivalInterface(oob []byte) int {
	for len(oob) >= unix.CmsgLen(0) {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			break
		}
		if h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo {
			// struct in6_pktinfo: addr, ifindex.
			return int(binary.NativeEndian.Uint32(data[16:20]))
		}
		oob = rest
	}
	return 0
}
