package relay

import (
	"math"
	"net"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// ListenTCP opens a listening TCP socket for a Group's Listen: non-blocking,
// close-on-exec, SO_REUSEADDR, l's options and TCP_INQ (SocketControl),
// bound to addr. An unspecified address listens on 0.0.0.0, or with
// dualStack (or an IPv6 one) on [::] for both families — IPv4 alone where
// the kernel has no IPv6 — which is what net.Listen does for "tcp4" and
// "tcp". It returns the socket and the address it is bound to (the port
// the kernel chose for port 0).
//
// The socket never enters the runtime's poller: one made by net.Listen
// had to be taken out of it for the loops, a duplicate descriptor, a
// deregistration and a close on top of its own registration and
// getsockname (strace, default liveness: 16 system calls per service port
// against 9 here). A first sync of 10,000 Services spent 19 % less CPU
// (BenchmarkKernelSync10k/first, 5 alternated runs).
// Errors are *net.OpError, as net.Listen's (errors.Is finds the errno).
func ListenTCP(addr netip.AddrPort, dualStack bool, l Liveness) (int, netip.AddrPort, error) {
	ip := addr.Addr().Unmap()
	family, network := unix.AF_INET, "tcp4"
	switch {
	case ip.IsValid() && !ip.IsUnspecified():
		network = "tcp"
		if ip.Is6() {
			family = unix.AF_INET6
		}
	case dualStack || ip.Is6():
		family, network, ip = unix.AF_INET6, "tcp", netip.IPv6Unspecified()
	default:
		ip = netip.IPv4Unspecified()
	}
	fd, err := rawio.Socket(family)
	if err == unix.EAFNOSUPPORT && ip.IsUnspecified() && family == unix.AF_INET6 {
		family, ip = unix.AF_INET, netip.IPv4Unspecified()
		fd, err = rawio.Socket(family)
	}
	at := netip.AddrPortFrom(ip, addr.Port())
	fail := func(call string, err error) (int, netip.AddrPort, error) {
		if fd >= 0 {
			rawio.Close(fd)
		}
		where := &net.TCPAddr{Port: int(at.Port())} // net.Listen's ":port" for a wildcard
		if !ip.IsUnspecified() {
			where = net.TCPAddrFromAddrPort(at)
		}
		return -1, netip.AddrPort{}, &net.OpError{Op: "listen", Net: network, Addr: where, Err: os.NewSyscallError(call, err)}
	}
	if err != nil {
		return fail("socket", err)
	}
	if err := rawio.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return fail("setsockopt", err)
	}
	if family == unix.AF_INET6 {
		if err := rawio.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return fail("setsockopt", err)
		}
	}
	if err := relayedSocketOptions(fd, l); err != nil {
		return fail("setsockopt", err)
	}
	if err := rawio.Bind(fd, at, family); err != nil {
		return fail("bind", err)
	}
	if err := rawio.Listen(fd, listenBacklog); err != nil {
		return fail("listen", err)
	}
	if at.Port() == 0 {
		if at, err = rawio.LocalAddr(fd); err != nil {
			return fail("getsockname", err)
		}
	}
	return fd, at, nil
}

// listenBacklog is net.Listen's: the kernel takes net.core.somaxconn for
// anything above it.
const listenBacklog = math.MaxInt32

// StopListening takes a listening socket out of the kernel's listening
// table (shutdown): connects to its port are refused (RST) as at a closed
// port, clients in its backlog are reset, and a port it was bound to by
// number stays its own (one the kernel chose is let go). ListenAgain undoes
// it.
//
// It also clears SO_REUSEADDR, so that no other socket can bind the port
// meanwhile: the kernel lets two SO_REUSEADDR sockets share a port while
// neither listens, whatever their users, so any local process could bind
// it and listen first, and the Service's clients reached that process.
// Without it on this socket, every other bind to the port is refused
// (EADDRINUSE), SO_REUSEADDR or not.
func StopListening(fd int) error {
	if err := rawio.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 0); err != nil {
		return os.NewSyscallError("setsockopt", err)
	}
	if err := unix.Shutdown(fd, unix.SHUT_RD); err != nil {
		return os.NewSyscallError("shutdown", err)
	}
	return nil
}

// ListenAgain makes a socket StopListening stopped listen again, and sets
// SO_REUSEADDR back (the connections it accepts inherit it, and their
// TIME_WAIT sockets must not keep a later ListenAgain off the port).
// Without SO_REUSEADDR the listen fails (EADDRINUSE) while connections it
// accepted before are open or in TIME_WAIT on the port: only then is it
// set first, which leaves another socket the two system calls between to
// bind and listen first. It fails when another socket listens on the port,
// and then leaves SO_REUSEADDR clear, as StopListening did.
func ListenAgain(fd int) error {
	err := rawio.Listen(fd, listenBacklog)
	if err == unix.EADDRINUSE {
		if err := rawio.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return os.NewSyscallError("setsockopt", err)
		}
		if err = rawio.Listen(fd, listenBacklog); err != nil {
			// Another socket listens on the port: no more may bind it
			// while this one waits to listen again.
			_ = rawio.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 0)
		}
	}
	if err != nil {
		return os.NewSyscallError("listen", err)
	}
	if err := rawio.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return os.NewSyscallError("setsockopt", err)
	}
	return nil
}
