package relay

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listenerState is what a listening socket's user sees of it.
type listenerState struct {
	domain, reuseAddr, v6only, inq, accepting            int
	keepAlive, keepIdle, keepIntvl, keepCnt, userTimeout int
	nonblocking, cloexec                                 bool
	addr                                                 netip.Addr
}

func readListenerState(t *testing.T, fd int) listenerState {
	t.Helper()
	var st listenerState
	get := func(level, opt int) int {
		v, err := unix.GetsockoptInt(fd, level, opt)
		if err != nil {
			t.Fatalf("getsockopt(%d, %d): %v", level, opt, err)
		}
		return v
	}
	st.domain = get(unix.SOL_SOCKET, unix.SO_DOMAIN)
	st.reuseAddr = get(unix.SOL_SOCKET, unix.SO_REUSEADDR)
	if st.domain == unix.AF_INET6 {
		st.v6only = get(unix.IPPROTO_IPV6, unix.IPV6_V6ONLY)
	}
	st.inq = get(unix.SOL_TCP, unix.TCP_INQ)
	st.accepting = get(unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	st.keepAlive = get(unix.SOL_SOCKET, unix.SO_KEEPALIVE)
	st.keepIdle = get(unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
	st.keepIntvl = get(unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
	st.keepCnt = get(unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
	st.userTimeout = get(unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	fdfl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	st.nonblocking, st.cloexec = fl&unix.O_NONBLOCK != 0, fdfl&unix.FD_CLOEXEC != 0
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		st.addr = netip.AddrFrom4(sa.Addr)
	case *unix.SockaddrInet6:
		st.addr = netip.AddrFrom16(sa.Addr)
	}
	return st
}

// ListenTCP's socket is the one net.ListenConfig with SocketControl makes
// (the proxier opened its sockets that way before), in every family case
// the proxier asks for, and it accepts clients of each family it takes.
func TestListenTCPMatchesNetListen(t *testing.T) {
	live := Liveness{KeepAliveIdle: 30 * time.Second, KeepAliveInterval: 10 * time.Second, KeepAliveCount: 5, UserTimeout: 20 * time.Second}
	for _, tc := range []struct {
		name      string
		addr      netip.Addr // invalid: no bind address
		dualStack bool
		network   string // what the proxier gave net.Listen
		host      string
		clients   []string
	}{
		{"IPv4 wildcard", netip.Addr{}, false, "tcp4", "", []string{"127.0.0.1"}},
		{"IPv4 wildcard given", netip.IPv4Unspecified(), false, "tcp4", "", []string{"127.0.0.1"}},
		{"dual stack", netip.Addr{}, true, "tcp", "", []string{"127.0.0.1", "::1"}},
		{"IPv6 wildcard given", netip.IPv6Unspecified(), false, "tcp", "", []string{"127.0.0.1", "::1"}},
		{"IPv4 address", netip.MustParseAddr("127.0.0.1"), true, "tcp", "127.0.0.1", []string{"127.0.0.1"}},
		{"IPv6 address", netip.IPv6Loopback(), false, "tcp", "::1", []string{"::1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.network == "tcp" && tc.host != "127.0.0.1" && !hasIPv6Loopback() {
				t.Skip("no IPv6 loopback")
			}
			lc := net.ListenConfig{KeepAlive: -1, Control: SocketControl(live)}
			lc.SetMultipathTCP(false) // as the proxier listens (Go's default is MPTCP)
			ln, err := lc.Listen(t.Context(), tc.network, net.JoinHostPort(tc.host, "0"))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			raw, err := ln.(*net.TCPListener).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var want listenerState
			_ = raw.Control(func(fd uintptr) { want = readListenerState(t, int(fd)) })

			fd, at, err := ListenTCP(netip.AddrPortFrom(tc.addr, 0), tc.dualStack, live)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			got := readListenerState(t, fd)
			if got != want {
				t.Errorf("socket state\n got %+v\nwant %+v", got, want)
			}
			if at.Port() == 0 || at.Addr() != got.addr {
				t.Errorf("bound address %v, socket says %v", at, got.addr)
			}
			for _, client := range tc.clients {
				c, err := net.DialTimeout("tcp", net.JoinHostPort(client, strconv.Itoa(int(at.Port()))), time.Second)
				if err != nil {
					t.Errorf("client from %s: %v", client, err)
					continue
				}
				c.Close()
			}
		})
	}
}

func hasIPv6Loopback() bool {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// A port in use fails as net.Listen fails: the same message, and errors.Is
// finds the errno (the port allocator retries on EADDRINUSE).
func TestListenTCPErrorsAsNetListen(t *testing.T) {
	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		addr          netip.Addr
		network, host string
	}{
		{netip.MustParseAddr("127.0.0.1"), "tcp", "127.0.0.1"},
		{netip.Addr{}, "tcp4", ""},
	} {
		_, wantErr := net.Listen(tc.network, net.JoinHostPort(tc.host, strconv.Itoa(port)))
		if wantErr == nil {
			t.Fatalf("net.Listen %s %q took a port in use", tc.network, tc.host)
		}
		fd, _, err := ListenTCP(netip.AddrPortFrom(tc.addr, uint16(port)), false, Liveness{})
		if err == nil {
			unix.Close(fd)
			t.Fatalf("ListenTCP %v took a port in use", tc.addr)
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			t.Errorf("ListenTCP %v: %v is not EADDRINUSE", tc.addr, err)
		}
		if err.Error() != wantErr.Error() {
			t.Errorf("ListenTCP %v: %q, net.Listen says %q", tc.addr, err, wantErr)
		}
	}
}

// bindReuseAddr binds a socket with SO_REUSEADDR to at, as any user's
// process may (the kernel checks no uid for SO_REUSEADDR), and closes it.
func bindReuseAddr(t *testing.T, at netip.AddrPort) error {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		t.Fatal(err)
	}
	return unix.Bind(fd, &unix.SockaddrInet4{Port: int(at.Port()), Addr: at.Addr().As4()})
}

// A socket that stopped listening keeps its port from every other socket,
// SO_REUSEADDR or not, and listens again, also with connections it
// accepted before still open or in TIME_WAIT on the port. Before, another
// SO_REUSEADDR socket could bind the stopped port, and listen on it first
// (the fault API's down port taken by any local user).
func TestStoppedListenerKeepsItsPort(t *testing.T) {
	for _, addr := range []string{"0.0.0.0", "127.0.0.1"} {
		t.Run(addr, func(t *testing.T) {
			// Bound by number, as the proxier binds a port it can stop
			// (a port the kernel chose is let go by StopListening).
			free, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := free.Addr().(*net.TCPAddr).Port
			free.Close()
			fd, at, err := ListenTCP(netip.AddrPortFrom(netip.MustParseAddr(addr), uint16(port)), false, Liveness{})
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			loopback := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), at.Port())
			// One connection closed by the server first (its side in
			// TIME_WAIT), one left open.
			for _, open := range []bool{false, true} {
				c, err := net.Dial("tcp", loopback.String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				var afd int
				for deadline := time.Now().Add(2 * time.Second); ; {
					if afd, _, err = unix.Accept(fd); err == nil || time.Now().After(deadline) {
						break
					}
					time.Sleep(time.Millisecond)
				}
				if err != nil {
					t.Fatal(err)
				}
				if !open {
					unix.Close(afd)
					_, _ = c.Read(make([]byte, 1))
				} else {
					defer unix.Close(afd)
				}
			}
			for round := range 2 {
				if err := StopListening(fd); err != nil {
					t.Fatal(err)
				}
				for _, other := range []netip.AddrPort{loopback, netip.AddrPortFrom(netip.IPv4Unspecified(), at.Port())} {
					if err := bindReuseAddr(t, other); !errors.Is(err, unix.EADDRINUSE) {
						t.Fatalf("round %d: a SO_REUSEADDR bind to %s of the stopped port: %v, want EADDRINUSE", round, other, err)
					}
				}
				if err := ListenAgain(fd); err != nil {
					t.Fatalf("round %d: listen again: %v", round, err)
				}
				c, err := net.DialTimeout("tcp", loopback.String(), time.Second)
				if err != nil {
					t.Fatalf("round %d: connect after listening again: %v", round, err)
				}
				c.Close()
			}
		})
	}
}

// A listen again that lost the port (another socket bound and listened in
// the instant ListenAgain sets SO_REUSEADDR back, played here by setting
// it first) fails, and leaves the port closed to further binds until it
// listens, once the other socket let go. Before, the failed listen left
// SO_REUSEADDR set: any socket could bind the port again meanwhile.
func TestListenAgainThatLostThePortKeepsItClosed(t *testing.T) {
	free, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	at := free.Addr().(*net.TCPAddr).AddrPort()
	free.Close()
	fd, _, err := ListenTCP(at, false, Liveness{})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// A connection open on the port: the listen needs SO_REUSEADDR.
	c, err := net.Dial("tcp", at.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	afd := -1
	for deadline := time.Now().Add(2 * time.Second); afd < 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		afd, _, _ = unix.Accept(fd)
	}
	if afd < 0 {
		t.Fatal("the client was not accepted")
	}
	defer unix.Close(afd)
	if err := StopListening(fd); err != nil {
		t.Fatal(err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("tcp4", at.String()) // SO_REUSEADDR, as net.Listen sets it
	if err != nil {
		t.Fatalf("the other socket could not take the port in the window: %v", err)
	}
	if err := ListenAgain(fd); !errors.Is(err, unix.EADDRINUSE) {
		other.Close()
		t.Fatalf("listen again on a port another socket listens on: %v, want EADDRINUSE", err)
	}
	other.Close()
	if err := bindReuseAddr(t, at); !errors.Is(err, unix.EADDRINUSE) {
		t.Fatalf("a SO_REUSEADDR bind after the failed listen again: %v, want EADDRINUSE", err)
	}
	if err := ListenAgain(fd); err != nil {
		t.Fatalf("listen again once the other socket let go: %v", err)
	}
}
