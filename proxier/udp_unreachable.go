package proxier

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"sync"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
)

// A UDP datagram that no endpoint can take (the service port has none,
// or none of the client's family) is answered with ICMP port unreachable,
// as kube-proxy's REJECT answers a Service without endpoints: the client's
// connected socket reports ECONNREFUSED at once, where it waited out its
// timeouts (a DNS lookup: seconds per server). Under a Local traffic
// policy without a local endpoint kube-proxy drops instead; here the
// client is refused, as a TCP client is reset. The error names the
// datagram as the proxy socket received it, after the portal's DNAT; the
// kernel's connection tracking relates it to the flow and rewrites it to
// the service address the client sent to, as it does for its own
// port-unreachable to a REDIRECTed flow. It needs a raw socket
// (CAP_NET_RAW): without one, such datagrams are dropped as before.

// unreachableRate bounds the errors sent per second (and their burst), for
// the whole proxier, as the kernel bounds all its ICMP
// (net.ipv4.icmp_msgs_per_sec, 1000): a flood to a Service without
// endpoints must not make the node a reflector. Each destination is held
// to far less first (destinationLimiter, udp_unreachable_limit.go).
const (
	unreachableRate  = 1000
	unreachableBurst = 50
)

// unreachableSender sends the errors of every UDP port of a proxier through
// one raw socket per family, opened on first use.
type unreachableSender struct {
	limit *rate.Limiter
	// perDestination holds each client address to the kernel's own rate
	// for it, checked before limit (so a flood aimed at one address does
	// not spend every other client's errors).
	perDestination *destinationLimiter

	// mu guards the sockets and is held across a send, so that close
	// never closes a descriptor a send is about to use (a port's Serve
	// may still be forwarding when the proxier stops).
	mu      sync.Mutex
	fd      [2]int // IPv4, IPv6; -1 until opened
	refused [2]bool
	closed  bool
}

func newUnreachableSender() *unreachableSender {
	return &unreachableSender{limit: rate.NewLimiter(unreachableRate, unreachableBurst), perDestination: newDestinationLimiter(), fd: [2]int{-1, -1}}
}

// allow reports whether an error may go to client about a datagram that
// arrived at local: within client's own rate, then within the global one.
func (u *unreachableSender) allow(client netip.Addr, local netip.AddrPort) bool {
	ok, _ := u.allowOrSpent(client, local)
	return ok
}

// allowOrSpent is allow, and also says whether it was the global rate,
// every client's, that was spent (a held port then stops reading a while;
// one client's spent rate is that client's alone).
func (u *unreachableSender) allowOrSpent(client netip.Addr, local netip.AddrPort) (ok, globalSpent bool) {
	if !u.perDestination.allow(client, local.Addr(), mono.Now()) {
		return false, false
	}
	if !u.limit.Allow() {
		return false, true
	}
	return true, false
}

// send answers the datagram payload that client sent to the proxy socket
// bound at bound (oob: the datagram's control messages, which say where
// it arrived when bound is the wildcard) with port unreachable. It does
// nothing when the client's rate or the global one is spent (checked
// before the message is built: a flood costs no more per datagram), the
// destination is unknown, or no raw socket can be had.
func (u *unreachableSender) send(client netip.AddrPort, oob []byte, bound netip.AddrPort, payload []byte) {
	if u == nil {
		return
	}
	local := datagramDestination(oob, bound)
	if !u.allow(client.Addr(), local) {
		return
	}
	u.sendTo(client, local, len(payload), nil)
}

// endpointFailed answers a session's client whose endpoint refused its
// datagrams (the endpoint's own port unreachable, which the proxy's backend
// socket took; unreach nil) or could not be reached (unreach: a destination
// unreachable of another code, the node's or a router's: no ARP/ND answer,
// no route, a firewall), with an error of the same code: kube-proxy's DNAT
// lets it reach the client, and without it the client waited out its
// timeouts, as for a Service without endpoints. local is where the
// session's first datagram arrived; the datagram itself is gone, so the
// quote carries its header alone.
func (u *unreachableSender) endpointFailed(client, local netip.AddrPort, unreach *icmpError) {
	if u == nil || !u.allow(client.Addr(), local) {
		return
	}
	u.sendTo(client, local, 0, unreach)
}

// sendTo sends the error about a datagram of payloadLen bytes from client
// to local, the rate already allowed: port unreachable, or with unreach
// the destination unreachable of its code.
func (u *unreachableSender) sendTo(client, local netip.AddrPort, payloadLen int, unreach *icmpError) {
	if !local.IsValid() || local.Addr().IsUnspecified() {
		return
	}
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	if client.Addr().Is4() != local.Addr().Is4() {
		return
	}
	family := 0
	if !client.Addr().Is4() {
		family = 1
	}
	var msg []byte
	if family == 0 {
		code := uint8(3) // port unreachable
		if unreach != nil {
			code = unreach.codeFor(false)
		}
		msg = destUnreachable4(code, client, local, payloadLen)
	} else {
		code := uint8(4) // port unreachable
		if unreach != nil {
			code = unreach.codeFor(true)
		}
		msg = destUnreachable6(code, client, local, payloadLen)
	}
	to := icmpDestination(client.Addr())
	u.mu.Lock()
	defer u.mu.Unlock()
	fd := u.socketLocked(family)
	if fd < 0 {
		return
	}
	if err := unix.Sendto(fd, msg, unix.MSG_DONTWAIT, to); err != nil {
		klog.V(4).InfoS("ICMP port unreachable not sent", "client", client, "err", err)
	}
}

// icmpDestination is the address an error to client is sent to: an IPv6
// link-local client's with its zone, the interface its datagram came in on
// (numeric, as rawio.AddrPortOf names it). Without it the kernel routed the
// error by the first link-local route, out of another link.
func icmpDestination(client netip.Addr) unix.Sockaddr {
	if client.Is4() {
		return &unix.SockaddrInet4{Addr: client.As4()}
	}
	sa := &unix.SockaddrInet6{Addr: client.As16()}
	if zone := client.Zone(); zone != "" {
		if id, err := strconv.ParseUint(zone, 10, 32); err == nil {
			sa.ZoneId = uint32(id)
		}
	}
	return sa
}

// socketLocked returns the raw socket of family (0: IPv4, 1: IPv6),
// opening it on first use; -1 when it cannot be had (said once) or the
// sender is closed. u.mu is held.
func (u *unreachableSender) socketLocked(family int) int {
	if u.closed {
		return -1
	}
	if u.fd[family] >= 0 || u.refused[family] {
		return u.fd[family]
	}
	var fd int
	var err error
	if family == 0 {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_ICMP)
	} else {
		// The kernel fills in an ICMPv6 checksum itself (RFC 3542).
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_ICMPV6)
		if err == nil {
			// Receive nothing: the socket only sends.
			var filter unix.ICMPv6Filter
			for i := range filter.Data {
				filter.Data[i] = 0xffffffff
			}
			_ = unix.SetsockoptICMPv6Filter(fd, unix.SOL_ICMPV6, unix.ICMPV6_FILTER, &filter)
		}
	}
	if err != nil {
		u.refused[family] = true
		klog.InfoS("UDP datagrams to service ports without endpoints are dropped without an ICMP port unreachable: no raw socket (needs CAP_NET_RAW)", "err", err)
		return -1
	}
	if family == 0 {
		// Receive nothing: a raw ICMP socket gets a copy of every ICMP
		// message the node receives unless its filter (ICMP_FILTER, a
		// mask of the types to drop) blocks them all.
		_ = unix.SetsockoptInt(fd, unix.SOL_RAW, icmpFilter, -1)
	}
	u.fd[family] = fd
	return fd
}

func (u *unreachableSender) close() {
	if u == nil {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	for i, fd := range u.fd {
		if fd >= 0 {
			unix.Close(fd)
			u.fd[i] = -1
		}
	}
}

// icmpFilter is Linux's ICMP_FILTER option of a raw IPv4 ICMP socket
// (linux/icmp.h), which x/sys/unix does not name.
const icmpFilter = 1

// quotedUDPHeaderLen: an ICMP error quotes the offending datagram's IP
// header and at least the first 8 bytes of what follows, here its UDP
// header, which is all a receiver matches on.
const quotedUDPHeaderLen = 8

// destUnreachable4 is the ICMP destination unreachable (type 3) of code
// (3: port unreachable) about a datagram of
// payloadLen bytes from client to local.
func destUnreachable4(code uint8, client, local netip.AddrPort, payloadLen int) []byte {
	b := make([]byte, 8+ipv4.HeaderLen+quotedUDPHeaderLen)
	b[0], b[1] = 3, code // destination unreachable
	ip := b[8 : 8+ipv4.HeaderLen]
	ip[0] = 0x45 // version 4, 5 words
	binary.BigEndian.PutUint16(ip[2:], uint16(min(ipv4.HeaderLen+quotedUDPHeaderLen+payloadLen, 0xffff)))
	ip[8] = 64 // TTL
	ip[9] = unix.IPPROTO_UDP
	src, dst := client.Addr().As4(), local.Addr().As4()
	copy(ip[12:16], src[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	putQuotedUDPHeader(b[8+ipv4.HeaderLen:], client, local, payloadLen)
	binary.BigEndian.PutUint16(b[2:], checksum(b))
	return b
}

// destUnreachable6 is the ICMPv6 destination unreachable (type 1) of
// code (4: port unreachable) about a datagram
// of payloadLen bytes from client to local; the kernel sets the checksum.
func destUnreachable6(code uint8, client, local netip.AddrPort, payloadLen int) []byte {
	b := make([]byte, 8+ipv6.HeaderLen+quotedUDPHeaderLen)
	b[0], b[1] = 1, code // destination unreachable
	ip := b[8 : 8+ipv6.HeaderLen]
	ip[0] = 0x60 // version 6
	binary.BigEndian.PutUint16(ip[4:], uint16(min(quotedUDPHeaderLen+payloadLen, 0xffff)))
	ip[6] = unix.IPPROTO_UDP
	ip[7] = 64 // hop limit
	src, dst := client.Addr().As16(), local.Addr().As16()
	copy(ip[8:24], src[:])
	copy(ip[24:40], dst[:])
	putQuotedUDPHeader(b[8+ipv6.HeaderLen:], client, local, payloadLen)
	return b
}

func putQuotedUDPHeader(h []byte, client, local netip.AddrPort, payloadLen int) {
	binary.BigEndian.PutUint16(h[0:], client.Port())
	binary.BigEndian.PutUint16(h[2:], local.Port())
	binary.BigEndian.PutUint16(h[4:], uint16(min(quotedUDPHeaderLen+payloadLen, 0xffff)))
	// A zero checksum: "not computed" for IPv4, and receivers do not
	// check the quoted one.
}

// checksum is the Internet checksum (RFC 1071) of b.
func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// datagramDestination is where a client's datagram reached the socket: the
// destination oob reports (IP_PKTINFO, IPV6_PKTINFO: a socket on the
// wildcard address), else the socket's own address; invalid when neither
// says. It allocates nothing.
func datagramDestination(oob []byte, bound netip.AddrPort) netip.AddrPort {
	for len(oob) >= unix.CmsgLen(0) {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			break
		}
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			// struct in_pktinfo: ifindex, spec_dst, addr (the header's destination).
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte(data[8:12])), bound.Port())
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			// struct in6_pktinfo: addr, ifindex.
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte(data[0:16])).Unmap(), bound.Port())
		}
		oob = rest
	}
	if bound.Addr().IsUnspecified() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(bound.Addr().Unmap(), bound.Port())
}
