package proxier

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
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
