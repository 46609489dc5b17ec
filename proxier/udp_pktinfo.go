package proxier

import (
	"net"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
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
// destination reported in oob, nil when oob reports none. Called once per
// session, so its allocations do not recur per datagram.
func replyControl(oob []byte) []byte {
	if len(oob) == 0 {
		return nil
	}
	var cm4 ipv4.ControlMessage
	if cm4.Parse(oob) == nil && cm4.Dst != nil {
		return (&ipv4.ControlMessage{Src: cm4.Dst}).Marshal()
	}
	var cm6 ipv6.ControlMessage
	if cm6.Parse(oob) == nil && cm6.Dst != nil {
		if v4 := cm6.Dst.To4(); v4 != nil {
			return (&ipv4.ControlMessage{Src: v4}).Marshal()
		}
		return (&ipv6.ControlMessage{Src: cm6.Dst}).Marshal()
	}
	return nil
}
