package rawio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mmsghdr is struct mmsghdr: one message of a recvmmsg(2) or sendmmsg(2)
// batch and, after the call, the bytes it carried. x/sys has neither the
// type nor the calls; x/net's ipv4.PacketConn ReadBatch/WriteBatch have
// both but allocate a net.Addr per datagram read and marshal every address
// on each write.
type Mmsghdr struct {
	Hdr unix.Msghdr
	Len uint32
}

// Recvmmsg reads up to len(msgs) datagrams from the non-blocking socket fd
// into the buffers the headers point at, and returns how many it read.
// Fewer than len(msgs): the socket's queue was empty when it returned, or
// an error (an ICMP report on a connected socket) ended the batch and the
// next call returns it; none queued is EAGAIN.
func Recvmmsg(fd int, msgs []Mmsghdr) (int, error) { return mmsg(unix.SYS_RECVMMSG, fd, msgs, 0) }

// RecvmmsgFlags is Recvmmsg with recvmmsg(2)'s flags (MSG_TRUNC: each
// message's Len is its datagram's length, whatever its buffer took).
func RecvmmsgFlags(fd int, msgs []Mmsghdr, flags int) (int, error) {
	return mmsg(unix.SYS_RECVMMSG, fd, msgs, flags)
}

// Sendmmsg sends the datagrams msgs describe on the non-blocking socket fd
// and returns how many the kernel took. An error on the first message is
// returned as such; an error on a later one ends the batch early (the
// count says where) and is lost, so a caller that wants it sends the rest
// again.
func Sendmmsg(fd int, msgs []Mmsghdr) (int, error) { return mmsg(unix.SYS_SENDMMSG, fd, msgs, 0) }

// mmsg is recvmmsg(2) or sendmmsg(2) (trap) of msgs on fd with flags,
// without timeout.
func mmsg(trap uintptr, fd int, msgs []Mmsghdr, flags int) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	r, _, e := unix.RawSyscall6(trap, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// Sendmsg is sendmsg(2) of a caller-built header (no allocation).
func Sendmsg(fd int, hdr *unix.Msghdr) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(hdr)), 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
