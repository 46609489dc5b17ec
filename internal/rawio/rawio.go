// Package rawio owns the data path's system calls on non-blocking
// descriptors: read, write and send, recvmmsg and sendmmsg, splice and shutdown,
// issued without telling the Go scheduler.
//
// unix.Read and friends go through Syscall, which marks the goroutine's P
// as in a system call. A call that outlasts sysmon's 20 µs tick — a write,
// splice or shutdown on a local path runs the receiver's network stack
// inline and takes 10-20 µs — has its P taken away and handed to another
// thread, and the caller's thread parks on return: two context switches,
// and sysmon kept waking every 20 µs while it happens. None of these calls
// can block on a non-blocking descriptor, so there is nothing to hand the P
// off for. make bench (perf stat, 6 alternated runs): 0.32-0.39 context
// switches per kept-alive request before, 0.20-0.23 after (HAProxy 0.23,
// nginx 0.19-0.24); CPU per request did not move beyond the runs' spread,
// nor did UDP (its switches are wake-ups of parked threads, not hand-offs).
//
// Every descriptor given to this package must be non-blocking: a raw call
// that blocks holds its thread and P until it returns.
package rawio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read is read(2).
func Read(fd int, p []byte) (int, error) { return transfer(unix.SYS_READ, fd, p, 0) }

// Write is write(2).
func Write(fd int, p []byte) (int, error) { return transfer(unix.SYS_WRITE, fd, p, 0) }

// Send is send(2) with MSG_DONTWAIT|MSG_NOSIGNAL, for a socket: it skips
// write(2)'s file layer (vfs_write was 0.7 % of the proxy's CPU per new
// connection under make bench, where HAProxy's sendto has none of it), and
// a peer's reset makes it fail with EPIPE without raising SIGPIPE, which
// the runtime would otherwise catch and discard for every such write.
func Send(fd int, p []byte) (int, error) {
	return transfer(unix.SYS_SENDTO, fd, p, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
}

// transfer is read(2), write(2) or sendto(2) with no address (trap) of p
// on fd; flags are sendto's (read and write ignore the arguments past
// their third). An empty p is a system call too: on a datagram socket it
// is an empty datagram, which some protocols send (keep-alives, probes).
func transfer(trap uintptr, fd int, p []byte, flags uintptr) (int, error) {
	var buf unsafe.Pointer
	if len(p) > 0 {
		buf = unsafe.Pointer(&p[0])
	}
	n, _, e := unix.RawSyscall6(trap, uintptr(fd), uintptr(buf), uintptr(len(p)), flags, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// Splice moves up to n bytes from rfd to wfd, one of which is a pipe
// (SPLICE_F_MOVE|SPLICE_F_NONBLOCK).
func Splice(rfd, wfd, n int) (int64, error) {
	m, _, e := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(rfd), 0, uintptr(wfd), 0, uintptr(n),
		unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
	if e != 0 {
		return 0, e
	}
	return int64(m), nil
}

// ShutdownWrite is shutdown(2) with SHUT_WR: the peer reads a FIN.
func ShutdownWrite(fd int) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SHUTDOWN, uintptr(fd), unix.SHUT_WR, 0); e != 0 {
		return e
	}
	return nil
}

// RecvInq reads into p like Read, on a TCP socket with TCP_INQ set, and
// returns the kernel's hint of what the read left: the bytes still queued,
// 1 when none are but a FIN is (the next read returns EOF), 0 when the
// queue is empty and open — the next read would only say EAGAIN — or -1
// when the socket sent no hint (TCP_INQ not set, not TCP).
func RecvInq(fd int, p []byte) (n, inq int, err error) {
	if len(p) == 0 {
		return 0, -1, nil
	}
	var ctl [4]uint64 // room for one cmsghdr and an int, aligned
	iov := unix.Iovec{Base: &p[0]}
	iov.SetLen(len(p))
	hdr := unix.Msghdr{Iov: &iov, Iovlen: 1, Control: (*byte)(unsafe.Pointer(&ctl[0]))}
	hdr.SetControllen(int(unsafe.Sizeof(ctl)))
	r, _, e := unix.RawSyscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&hdr)), 0)
	if e != 0 {
		return 0, -1, e
	}
	inq = -1
	if hdr.Controllen >= unix.SizeofCmsghdr+4 {
		c := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		if c.Level == unix.SOL_TCP && c.Type == unix.TCP_CM_INQ {
			inq = int(*(*int32)(unsafe.Pointer(&ctl[2])))
		}
	}
	return int(r), inq, nil
}

// AtMark reports whether a TCP socket's next byte is an urgent (MSG_OOB)
// byte's mark (ioctl SIOCATMARK). splice stops at the mark and says EAGAIN
// there, however much is queued behind it; recvmsg steps over it. SIOCINQ
// cannot tell: it counts only the bytes before the mark, 0 at it.
func AtMark(fd int) bool {
	var v int32
	_, _, e := unix.RawSyscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCATMARK, uintptr(unsafe.Pointer(&v)))
	return e == 0 && v != 0
}

// EpollPoll is epoll_wait without waiting: the events ready now (0 on any
// error, EINTR included: the caller looks again rather than sleep on
// events it did not see).
func EpollPoll(epfd int, events []unix.EpollEvent) int {
	if len(events) == 0 {
		return 0
	}
	// epoll_pwait with no signal mask is epoll_wait on every architecture
	// (arm64 has no epoll_wait).
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])),
		uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0
	}
	return int(r)
}
