package proxier

import (
	"encoding/binary"
	"errors"
	"flag"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"
)

// TestUDPEndpointUnreachableReachesTheClient: an endpoint the node cannot
// reach (a deleted pod's address answers no ARP/ND: the node's own host
// unreachable; a route to it that ends in net unreachable) ended the
// session silently, or not at all, and the client waited out its timeout
// (a DNS client 5 s per try), where through kube-proxy's DNAT the node's
// error reaches it and a resolver (glibc's sets IP_RECVERR on its UDP
// sockets) tries the next server at once. Linux reports these soft
// errors to the session's connected socket only with IP_RECVERR
// (IPV6_RECVERR), through its error queue. The error is injected here as
// the node's neighbour code sends it, about the datagram the session's
// socket sent; the client then gets a host unreachable of its own, the
// failure is counted, and its next datagram opens a new session.
// Needs CAP_NET_RAW.
func TestUDPEndpointUnreachableReachesTheClient(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs CAP_NET_RAW (root) for raw ICMP sockets")
	}
	for _, tt := range []struct{ name, bind, endpoint, client string }{
		{"IPv4", "127.0.0.1", "127.0.0.2", "udp4"},
		{"IPv6", "::1", "::1", "udp6"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pc, err := net.ListenPacket(tt.client, net.JoinHostPort(tt.endpoint, "0"))
			if err != nil {
				t.Fatal(err)
			}
			be := pc.(*net.UDPConn)
			t.Cleanup(func() { be.Close() })
			endpoint := be.LocalAddr().(*net.UDPAddr).AddrPort()
			// A long idle timeout: the error must find the session alive
			// on a loaded machine (a node's failed ARP comes seconds
			// after the datagram, and reaches only a session that lives).
			p := newTestProxier(t, Options{BindAddress: netip.MustParseAddr(tt.bind), UDPIdleTimeout: time.Minute})
			svc := makeService("dns", withProtocol(v1.ProtocolUDP))
			slice := makeSlice("dns", v1.ProtocolUDP, endpoint.String())
			if tt.client == "udp6" {
				withClusterIP("fd00::10")(svc)
				slice.AddressType = discovery.AddressTypeIPv6
			}
			p.OnServiceAdd(svc)
			p.OnEndpointSliceAdd(slice)
			p.Sync()
			port, ok := p.ProxyPort("default/dns:p")
			if !ok {
				t.Fatal("no proxy socket")
			}
			c, err := net.Dial(tt.client, net.JoinHostPort(tt.bind, strconv.Itoa(port)))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// As glibc's resolver does: without it a socket is not told of
			// a host unreachable at all, through kube-proxy neither.
			setRecvErr(t, c.(*net.UDPConn), tt.client == "udp6")

			if _, err := c.Write([]byte("query")); err != nil {
				t.Fatal(err)
			}
			session := readFrom(t, be, "query")
			injectHostUnreachable(t, session, endpoint)
			start := time.Now()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Read(make([]byte, 64))
			if !errors.Is(err, syscall.EHOSTUNREACH) {
				t.Fatalf("read: %v after %v, want EHOSTUNREACH at once (the endpoint could not be reached)", err, time.Since(start))
			}
			if got := p.metrics.ports.lookup("default/dns:p").dialFailures.value(); got != 1 {
				t.Errorf("dial_failures_total %v, want 1", got)
			}
			// The next datagram opens a new session, which is served.
			if _, err := c.Write([]byte("again")); err != nil {
				t.Fatal(err)
			}
			readFrom(t, be, "again")
		})
	}
}

func setRecvErr(t *testing.T, c *net.UDPConn, v6 bool) {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVERR, 1)
		}
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
}

// readFrom reads datagrams on be until one says want and returns its
// source (the session's socket).
func readFrom(t *testing.T, be *net.UDPConn, want string) netip.AddrPort {
	t.Helper()
	buf := make([]byte, 64)
	_ = be.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		n, from, err := be.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("the endpoint got no %q: %v", want, err)
		}
		if string(buf[:n]) == want {
			return netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		}
	}
}

// injectHostUnreachable sends the node's host (IPv6: address) unreachable
// about a datagram from session to endpoint, as its neighbour code does
// when ARP/ND for the endpoint fails.
func injectHostUnreachable(t *testing.T, session, endpoint netip.AddrPort) {
	t.Helper()
	var fd int
	var err error
	var msg []byte
	var to unix.Sockaddr
	if session.Addr().Is4() {
		msg = destUnreachable4(1, session, endpoint, 5) // host unreachable
		to = &unix.SockaddrInet4{Addr: session.Addr().As4()}
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	} else {
		msg = destUnreachable6(3, session, endpoint, 5) // address unreachable
		to = &unix.SockaddrInet6{Addr: session.Addr().As16()}
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, msg, 0, to); err != nil {
		t.Fatal(err)
	}
}

// An ICMP error the session passes over (time exceeded: a routing loop on
// the way to the endpoint, or forged by anyone who can name the session's
// ports) must not end the session however it comes. On EPOLLERR it was
// read off the error queue and ignored, but one that arrived after the
// poller looked, while a reply was waiting (the poller said readable
// only), was first reported by the receive as the socket's pending error
// (EHOSTUNREACH, set for every ICMP error with IP_RECVERR): the session
// was closed as broken, silently, and the reply waiting on it was lost.
// A flood of forged time exceeded errors closed busy sessions at will on
// the real binary. The test places the error exactly: the reply is queued,
// the error arrives, then the reply loop reads the socket as the poller
// had reported it readable. Needs CAP_NET_RAW.
func TestUDPSessionSurvivesIgnoredICMPErrorBeforeReceive(t *testing.T) {
	ip := newICMPSession(t)
	ip.waitReplyQueued(t, ip.sess)
	injectTimeExceeded(t, ip.fd, ip.local, ip.endpoint)

	// The poller looked before the error came: it said readable only.
	b := getUDPBatch()
	ip.sock.batch = b
	ip.sock.relayFrom(ip.fd, b)
	ip.sock.flushReplies()
	ip.sock.batch = nil
	putUDPBatch(b)
	if ip.session() == nil {
		t.Fatal("a time exceeded error that came between the poller's look and the receive closed the session (and lost its waiting reply); on EPOLLERR it is ignored")
	}
	ip.relayWhenQueued(t) // the reply is still there: read at the next wake
	if got := ip.reply(time.Second); got != "a:q1" {
		t.Fatalf("client got %q, want the waiting reply a:q1", got)
	}
	if got := ip.sock.dialFailures.value(); got != 0 {
		t.Errorf("dial_failures_total %v, want 0 (a time exceeded is not the endpoint's failure)", got)
	}
}

// A client datagram sent while such an error is the socket's pending one
// goes to the endpoint: the send that took the error sent nothing, and
// the datagram was lost (its client waited out its timeout, and the
// session idled out meanwhile). Needs CAP_NET_RAW.
func TestUDPDatagramSentAfterIgnoredICMPErrorReachesEndpoint(t *testing.T) {
	ip := newICMPSession(t)
	ip.relayWhenQueued(t)
	if got := ip.reply(time.Second); got != "a:q1" {
		t.Fatalf("client got %q, want a:q1", got)
	}
	injectTimeExceeded(t, ip.fd, ip.local, ip.endpoint)

	// The client's next datagram comes before the poller looks.
	ip.send("q2")
	if ip.session() == nil {
		t.Fatal("a time exceeded error ended the session")
	}
	ip.relayWhenQueued(t)
	if got := ip.reply(time.Second); got != "a:q2" {
		t.Fatalf("client got %q, want a:q2: the datagram sent after a time exceeded error was lost", got)
	}
}

// icmpSession is a UDP port (the test relays) whose client sent q1 to an
// echo endpoint (it answers "a:" and the datagram), for the tests that
// send ICMP errors about the session's datagrams; it skips them without
// CAP_NET_RAW.
type icmpSession struct {
	*inflightPort
	sess *udpSession
	fd   int
	// local is the session socket's address, which the endpoint sees and
	// the errors name; endpoint is the endpoint's.
	local, endpoint netip.AddrPort
}

func newICMPSession(t *testing.T) icmpSession {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs CAP_NET_RAW (root) for raw ICMP sockets")
	}
	a := startUDPEcho(t, "127.0.0.1:0", "a:")
	is := icmpSession{endpoint: a.LocalAddr().(*net.UDPAddr).AddrPort()}
	is.inflightPort = newInflightPort(t, time.Minute, is.endpoint)
	is.send("q1")
	if is.sess = is.session(); is.sess == nil {
		t.Fatal("no session after the first datagram")
	}
	is.sock.mu.Lock()
	is.fd, is.local = is.sess.fd, netip.AddrPortFrom(is.endpoint.Addr(), is.sess.port)
	is.sock.mu.Unlock()
	return is
}

// injectTimeExceeded sends an ICMP time exceeded (type 11, code 0) about a
// datagram from session to endpoint, and waits until the session's socket
// fd holds it.
func injectTimeExceeded(t *testing.T, fd int, session, endpoint netip.AddrPort) {
	t.Helper()
	injectICMP4(t, fd, session, endpoint, 11, 0) // time exceeded in transit
}

// extendedErr is the control message an error queue read returns: a
// struct sock_extended_err (and room for the offender's address) under
// level and typ.
func extendedErr(level, typ int32, origin, icmpType, code uint8, errno unix.Errno) []byte {
	b := make([]byte, unix.CmsgSpace(sizeofSockExtendedErr+unix.SizeofSockaddrInet6))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(sizeofSockExtendedErr + unix.SizeofSockaddrInet6))
	d := b[unix.CmsgLen(0):]
	binary.NativeEndian.PutUint32(d[0:], uint32(errno))
	d[4], d[5], d[6] = origin, icmpType, code
	return b
}

// parseExtendedErr tells a destination unreachable (which ends the session
// and is passed on to the client) from the ICMP errors the kernel handles
// itself and the proxy passes over. A fragmentation needed or Packet Too
// Big taken as unreachable would end every session whose path narrows and
// send its client a forged "fragmentation needed" with a next-hop MTU of 0.
func TestParseExtendedErr(t *testing.T) {
	const (
		v4, v6 = false, true
	)
	for _, tc := range []struct {
		name           string
		v6             bool
		origin, typ, c uint8
		errno          unix.Errno
		unreach, port  bool
	}{
		{"IPv4 port unreachable", v4, unix.SO_EE_ORIGIN_ICMP, 3, 3, unix.ECONNREFUSED, true, true},
		{"IPv4 host unreachable", v4, unix.SO_EE_ORIGIN_ICMP, 3, 1, unix.EHOSTUNREACH, true, false},
		{"IPv4 admin prohibited", v4, unix.SO_EE_ORIGIN_ICMP, 3, 13, unix.EHOSTUNREACH, true, false},
		{"IPv4 fragmentation needed", v4, unix.SO_EE_ORIGIN_ICMP, 3, 4, unix.EMSGSIZE, false, false},
		{"IPv4 time exceeded", v4, unix.SO_EE_ORIGIN_ICMP, 11, 0, unix.EHOSTUNREACH, false, false},
		{"IPv4 parameter problem", v4, unix.SO_EE_ORIGIN_ICMP, 12, 0, unix.EPROTO, false, false},
		{"IPv4 local", v4, unix.SO_EE_ORIGIN_LOCAL, 0, 0, unix.EMSGSIZE, false, false},
		{"IPv6 port unreachable", v6, unix.SO_EE_ORIGIN_ICMP6, 1, 4, unix.ECONNREFUSED, true, true},
		{"IPv6 address unreachable", v6, unix.SO_EE_ORIGIN_ICMP6, 1, 3, unix.EHOSTUNREACH, true, false},
		{"IPv6 no route", v6, unix.SO_EE_ORIGIN_ICMP6, 1, 0, unix.ENETUNREACH, true, false},
		{"IPv6 packet too big", v6, unix.SO_EE_ORIGIN_ICMP6, 2, 0, unix.EMSGSIZE, false, false},
		{"IPv6 time exceeded", v6, unix.SO_EE_ORIGIN_ICMP6, 3, 0, unix.EHOSTUNREACH, false, false},
		{"IPv6 local", v6, unix.SO_EE_ORIGIN_LOCAL, 0, 0, unix.EMSGSIZE, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			level, typ := int32(unix.IPPROTO_IP), int32(unix.IP_RECVERR)
			if tc.v6 {
				level, typ = unix.IPPROTO_IPV6, unix.IPV6_RECVERR
			}
			e := parseExtendedErr(extendedErr(level, typ, tc.origin, tc.typ, tc.c, tc.errno))
			if e.unreachErr != tc.unreach || e.v6 != tc.v6 || e.code != tc.c || e.errno != tc.errno {
				t.Fatalf("parsed %+v, want a destination unreachable: %v (IPv6 %v, code %d, errno %v)", e, tc.unreach, tc.v6, tc.c, tc.errno)
			}
			if tc.unreach && e.portUnreachable() != tc.port {
				t.Fatalf("port unreachable: %v, want %v", e.portUnreachable(), tc.port)
			}
		})
	}
	// The client of the other family gets host (IPv4) or address (IPv6)
	// unreachable; of the same family the endpoint's own code.
	for _, tc := range []struct {
		e    icmpError
		v6   bool
		want uint8
	}{
		{icmpError{v6: false, code: 13}, false, 13},
		{icmpError{v6: false, code: 13}, true, 3},
		{icmpError{v6: true, code: 0}, true, 0},
		{icmpError{v6: true, code: 0}, false, 1},
	} {
		if got := tc.e.codeFor(tc.v6); got != tc.want {
			t.Errorf("code for an IPv6 (%v) client of %+v: %d, want %d", tc.v6, tc.e, got, tc.want)
		}
	}
}

// An ICMP error the proxy passes over (here a time exceeded) keeps the
// session whether the poller reports it (EPOLLERR: the error queue is
// read first) or a receive meets it first, as when it comes after the
// poller looked: with IP_RECVERR the kernel sets the socket's error for
// it too (EHOSTUNREACH), and the receive's error closed the session as
// broken, its client moved to another endpoint mid-flow and the replies
// on their way lost, where the same error seen by the poller left it.
// Needs CAP_NET_RAW.
func TestUDPPassedOverICMPErrorMetByAReceiveKeepsTheSession(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs CAP_NET_RAW (root) for raw ICMP sockets")
	}
	for _, viaPoller := range []bool{true, false} {
		t.Run(map[bool]string{true: "poller", false: "receive"}[viaPoller], func(t *testing.T) {
			pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pc.Close() })
			endpoint := pc.LocalAddr().(*net.UDPAddr).AddrPort()
			ip := newInflightPort(t, time.Minute, endpoint)
			ip.send("q")
			session := readFrom(t, pc, "q")
			sess := ip.session()
			if sess == nil {
				t.Fatal("no session after the first datagram")
			}
			injectTimeExceeded(t, sess.fd, session, endpoint)
			if viaPoller {
				ip.relay()
			} else {
				b := getUDPBatch()
				ip.sock.relayFrom(sess.fd, b)
				putUDPBatch(b)
			}
			if got := ip.session(); got != sess {
				t.Fatal("a time exceeded closed the session")
			}
			if n := ip.sock.poller.ready(); n != 0 {
				t.Fatalf("%d socket(s) still ready after the error was acted on", n)
			}
		})
	}
}

// The line of an unreachable endpoint names the ICMP code, as be682e2
// wrote it (code=1: no ARP/ND answer; 0: a router's net unreachable; 13: a
// firewall), which the errno alone does not tell apart.
func TestUDPUnreachableEndpointLineNamesTheCode(t *testing.T) {
	buf := captureKlog(t)
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", "2")
	t.Cleanup(func() { _ = fs.Set("v", "0") })
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	ip := newInflightPort(t, time.Minute, pc.LocalAddr().(*net.UDPAddr).AddrPort())
	ip.send("q")
	sess := ip.session()
	if sess == nil {
		t.Fatal("no session after the first datagram")
	}
	ip.sock.mu.Lock()
	ip.sock.endpointFailedLocked(sess, &icmpError{code: 13, errno: unix.EHOSTUNREACH, unreachErr: true}, unix.EHOSTUNREACH)
	ip.sock.mu.Unlock()
	klog.Flush()
	if line := buf.String(); !strings.Contains(line, "could not be reached") || !strings.Contains(line, "code=13") {
		t.Fatalf("no code=13 in the unreachable endpoint's line:\n%s", line)
	}
}
