package rawio

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The event loop's per-connection calls (relay's Loop): accept, socket,
// options, connect, epoll registration, close. Each is short on a
// non-blocking socket; through Syscall each cost a scheduler round trip,
// and unix.Accept4 also asked the listener for its protocol on every
// accept (a getsockopt, to tell L2TP from TCP).

func errno(e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// Accept4 accepts a client of the listening socket fd (non-blocking,
// close-on-exec) and returns its address (AddrPortOf).
func Accept4(fd int) (int, netip.AddrPort, error) {
	var sa unix.RawSockaddrInet6
	n := uint32(unix.SizeofSockaddrInet6)
	r, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(fd), uintptr(unsafe.Pointer(&sa)),
		uintptr(unsafe.Pointer(&n)), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if e != 0 {
		return -1, netip.AddrPort{}, e
	}
	return int(r), AddrPortOf(&sa), nil
}

// Socket opens a non-blocking, close-on-exec TCP socket of family.
func Socket(family int) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(family), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// DatagramSocket opens a non-blocking, close-on-exec UDP socket of family.
func DatagramSocket(family int) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(family), unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// SetsockoptInt is setsockopt(2) with an int value.
func SetsockoptInt(fd, level, opt, value int) error {
	v := int32(value)
	_, _, e := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&v)), 4, 0)
	return errno(e)
}

// SocketError is getsockopt(SO_ERROR): how a non-blocking connect ended
// (nil: connected).
func SocketError(fd int) error {
	var v int32
	n := uint32(4)
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_ERROR,
		uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return e
	}
	return errno(unix.Errno(v))
}

// Connect starts connecting the non-blocking socket fd, of ep's family
// (IPv4-mapped addresses count as IPv4), to ep; EINPROGRESS is returned as
// is (the usual answer).
func Connect(fd int, ep netip.AddrPort) error {
	addr, family := ep.Addr().Unmap(), unix.AF_INET6
	if addr.Is4() {
		family = unix.AF_INET
	}
	var sa unix.RawSockaddrInet6
	n, ok := PutSockaddr(&sa, netip.AddrPortFrom(addr, ep.Port()), family)
	if !ok {
		return unix.EINVAL
	}
	_, _, e := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(n))
	return errno(e)
}

// EpollAdd adds fd to the epoll set epfd.
func EpollAdd(epfd, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), unix.EPOLL_CTL_ADD, uintptr(fd),
		uintptr(unsafe.Pointer(ev)), 0, 0)
	return errno(e)
}

// Close is close(2) on a socket (with SO_LINGER 0 it sends a reset and
// returns at once; otherwise the FIN is sent in the background).
func Close(fd int) error {
	_, _, e := unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
	return errno(e)
}

// Bind binds the socket fd, of family, to ep (an AF_INET6 socket takes
// IPv4 as ::ffff:a.b.c.d, as PutSockaddr).
func Bind(fd int, ep netip.AddrPort, family int) error {
	var sa unix.RawSockaddrInet6
	n, ok := PutSockaddr(&sa, ep, family)
	if !ok {
		return unix.EINVAL
	}
	_, _, e := unix.RawSyscall(unix.SYS_BIND, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(n))
	return errno(e)
}

// Listen is listen(2). The kernel caps backlog at net.core.somaxconn.
func Listen(fd, backlog int) error {
	_, _, e := unix.RawSyscall(unix.SYS_LISTEN, uintptr(fd), uintptr(backlog), 0)
	return errno(e)
}

// LocalAddr is getsockname(2), decoded as AddrPortOf.
func LocalAddr(fd int) (netip.AddrPort, error) {
	var sa unix.RawSockaddrInet6
	n := uint32(unix.SizeofSockaddrInet6)
	_, _, e := unix.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&n)))
	if e != 0 {
		return netip.AddrPort{}, e
	}
	return AddrPortOf(&sa), nil
}

// TCP states (linux/tcp_states.h) that TCPState reports.
const (
	TCPSynSent   = 2  // connecting: the SYN sent, no answer yet
	TCPClose     = 7  // closed: reset, or both FINs through (the socket then lives on as a time-wait one)
	TCPCloseWait = 8  // the peer's FIN received, ours not sent
	TCPLastAck   = 9  // both FINs sent, ours not acknowledged
	TCPClosing   = 11 // FINs crossed
)

// TCPState returns fd's TCP state (TCP_INFO's tcpi_state, its first byte:
// the kernel copies as much of the structure as asked for, so nothing of
// it is allocated), -1 when it cannot be read.
func TCPState(fd int) int {
	var state uint8
	n := uint32(1)
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&state)), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 || n < 1 {
		return -1
	}
	return int(state)
}

// TCPClosed reports whether fd's TCP connection is closed (TCPClose): its
// peer reset it, or the kernel ended it with an error. As a RawConn Read or
// Write callback it keeps the caller parked in the runtime's poller until
// then: the poller calls it first (an event that came before the wait is
// not signalled again), then at every event on the socket, and the peer's
// data or FIN, which wake a writer as well as a reader, do not end the
// wait. A function, not a closure or method value: passing it allocates
// nothing.
func TCPClosed(fd uintptr) bool { return TCPState(int(fd)) == TCPClose }

// PollOut asks poll(2), without waiting, whether fd is writable now: the
// events it reports (POLLOUT, POLLERR, POLLHUP; 0 when none), EINTR tried
// again. A poll that finds a socket not writable also asks the kernel to
// signal it once it is (SOCK_NOSPACE), which an epoll set then sees.
func PollOut(fd int) (int16, error) {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(fds[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return 0, err
		}
		return fds[0].Revents, nil
	}
}
