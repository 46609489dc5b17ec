package rawio

import (
	"encoding/binary"
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
// close-on-exec) and returns its address (IPv4-mapped addresses unmapped).
func Accept4(fd int) (int, netip.AddrPort, error) {
	var sa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	r, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(fd), uintptr(unsafe.Pointer(&sa)),
		uintptr(unsafe.Pointer(&n)), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if e != 0 {
		return -1, netip.AddrPort{}, e
	}
	return int(r), sockaddrAddrPort(&sa), nil
}

func sockaddrAddrPort(sa *unix.RawSockaddrAny) netip.AddrPort {
	switch sa.Addr.Family {
	case unix.AF_INET:
		in := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), port(in.Port))
	case unix.AF_INET6:
		in := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom16(in.Addr).Unmap(), port(in.Port))
	}
	return netip.AddrPort{}
}

// port converts a sockaddr's port (network byte order in memory).
func port(p uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&p))
	return binary.BigEndian.Uint16(b[:])
}

// Socket opens a non-blocking, close-on-exec TCP socket of family.
func Socket(family int) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(family), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
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

// Connect starts connecting the non-blocking socket fd to ep; EINPROGRESS
// is returned as is (the usual answer).
func Connect(fd int, ep netip.AddrPort) error {
	addr := ep.Addr().Unmap()
	var sa unsafe.Pointer
	var n uintptr
	var in4 unix.RawSockaddrInet4
	var in6 unix.RawSockaddrInet6
	pb := (*[2]byte)(nil)
	if addr.Is4() {
		in4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: addr.As4()}
		pb = (*[2]byte)(unsafe.Pointer(&in4.Port))
		sa, n = unsafe.Pointer(&in4), unix.SizeofSockaddrInet4
	} else {
		in6 = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: addr.As16()}
		pb = (*[2]byte)(unsafe.Pointer(&in6.Port))
		sa, n = unsafe.Pointer(&in6), unix.SizeofSockaddrInet6
	}
	binary.BigEndian.PutUint16(pb[:], ep.Port())
	_, _, e := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(sa), n)
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
