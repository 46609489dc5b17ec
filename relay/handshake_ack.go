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
// server that speaks first would wait that long to accept.
//
// The held ACK also primes the kernel's delayed-ACK clock, so the first
// write to the backend, soon after, puts the socket in its interactive
// ("pingpong") mode, where the ACK of each answer waits for a reply to
// ride on, up to 40 ms: a backend with Nagle on (most that are not written
// in Go) that answers in two writes then holds its second for that ACK,
// 40 ms on every connection's first answer. So the first write to the
// backend is followed by TCP_QUICKACK 1, which leaves that mode. The event
// loop does all of it in LoopConn.connect, connected and write; the
// goroutine relay's dialer uses DialControl, its caller
// ReleaseHandshakeACK, and the relay Conn.BackendHoldsACK.

func holdHandshakeACK(fd int) { _ = rawio.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0) }
func sendHandshakeACK(fd int) { _ = rawio.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1) }

// DialControl is SocketControl(l) for a socket about to connect: it also
// holds the handshake's last ACK. Whoever dials with it must call
// ReleaseHandshakeACK once connected, and relay with the built-in copy
// after Conn.BackendHoldsACK.
func DialControl(l Liveness) func(network, address string, c syscall.RawConn) error {
	return socketControl(l, dialHoldingACK)
}

// BackendControl is SocketControl(l) for a backend socket about to connect
// that holds no handshake ACK (the faulted connections' dialer): it, like
// DialControl, fails the dial with ErrDescriptorReserve when the socket
// fell in the descriptor reserve.
func BackendControl(l Liveness) func(network, address string, c syscall.RawConn) error {
	return socketControl(l, dialing)
}

// ReleaseHandshakeACK sends backend's held handshake ACK now unless the
// client has bytes queued, which the relay writes at once and which carry
// it.
func ReleaseHandshakeACK(backend, client *net.TCPConn) {
	if queuedBytes(client) > 0 {
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
