package proxier

import (
	"encoding/binary"
	"net"
	"net/netip"

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

// replyControl returns the control message that sends a reply from the
// destination reported in oob (datagramDestination reads it), nil when oob
// reports none. Called once per session, so its allocations do not recur
// per datagram.
func replyControl(oob []byte) []byte {
	dst := datagramDestination(oob, netip.AddrPort{})
	switch {
	case !dst.IsValid():
		return nil
	case dst.Addr().Is4():
		a := dst.Addr().As4()
		return (&ipv4.ControlMessage{Src: net.IP(a[:])}).Marshal()
	}
	a := dst.Addr().As16()
	cm := &ipv6.ControlMessage{Src: net.IP(a[:])}
	if dst.Addr().IsLinkLocalUnicast() {
		// A link-local source means nothing without its link: the
		// kernel refuses it (EINVAL) unless the reply names the
		// interface, the one the datagram came in on. A global source
		// leaves the interface to the route, as kube-proxy's replies
		// do: the arrival one is wrong under asymmetric routing.
		cm.IfIndex = arrivalInterface(oob)
	}
	return cm.Marshal()
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
