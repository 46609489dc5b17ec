package relay

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// Both data paths hold a dialled backend socket's handshake ACK (as
// HAProxy's tcp-smart-connect does): the socket is put in delayed-ACK mode
// before connect (holdHandshakeACK), so the kernel holds the handshake's
// last ACK and the client's first bytes, usually queued by the time the
// backend answers, carry it: one segment less per connection, and the
// backend wakes once for connection and request instead of twice. When no
// first bytes are about to go, the ACK is sent at once (sendHandshakeACK):
// the kernel would hold it for its delayed-ACK timer (up to 200 ms), and a
// server that speaks first would wait that long to accept. The event loop
// does both in LoopConn.connect and connected; the goroutine relay's
// dialer uses DialControl, and its caller ReleaseHandshakeACK.

func holdHandshakeACK(fd int) { _ = rawio.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0) }
func sendHandshakeACK(fd int) { _ = rawio.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1) }

// DialControl is SocketControl(l) for a socket about to connect: it also
// holds the handshake's last ACK. Whoever dials with it must call
// ReleaseHandshakeACK once connected.
func DialControl(l Liveness) func(network, address string, c syscall.RawConn) error {
	return socketControl(l, true)
}

// ReleaseHandshakeACK sends backend's held handshake ACK now unless the
// client has bytes queued, which the relay writes at once and which carry
// it; force sends it whatever is queued (a faulted connection, whose first
// bytes a toxic may hold past the kernel's timer).
func ReleaseHandshakeACK(backend, client *net.TCPConn, force bool) {
	if !force && queuedBytes(client) > 0 {
		return
	}
	if raw, err := backend.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) { sendHandshakeACK(int(fd)) })
	}
}

// queuedBytes is what c has received and not yet read (0 on an error).
func queuedBytes(c *net.TCPConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n
}
