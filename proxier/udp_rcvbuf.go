package proxier

import "golang.org/x/sys/unix"

// udpReceiveBuffer is the receive buffer of a UDP service socket, and of a
// session's backend socket once its replies come several at a time. The
// kernel's default (net.core.rmem_default, 208 KiB) held 26 of a backend's
// burst of 64 replies of 8,000 bytes, and a service socket's queue dropped
// 35-45 % of a thousand new clients arriving at once, where the backend
// alone took them all: a proxy in between must queue at least what its
// peers would. It is a bound, not an allocation: an idle socket holds
// nothing, and the kernel's udp_mem bounds all sockets together.
const udpReceiveBuffer = 4 << 20

// growServiceReceiveBuffer raises a service socket's receive buffer to
// udpReceiveBuffer, past net.core.rmem_max with CAP_NET_ADMIN (which a
// proxy with iptables has): one socket per service port.
func growServiceReceiveBuffer(fd int) {
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, udpReceiveBuffer) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, udpReceiveBuffer)
	}
}

// growSessionReceiveBuffer raises a session's backend socket's receive
// buffer to udpReceiveBuffer within net.core.rmem_max: a port may hold
// tens of thousands of sessions, and the node's administrator bounds
// each socket's share there.
func growSessionReceiveBuffer(fd int) {
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, udpReceiveBuffer)
}
