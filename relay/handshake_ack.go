package relay

import (
	"net"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// The goroutine relay's share of the held handshake ACK (the event loop
// does the same in LoopConn.connect and connected): a dialled backend
// socket is put in delayed-ACK mode before connect (TCP_QUICKACK 0), so
// the kernel holds the handshake's last ACK and the client's first bytes
// carry it: one segment less per connection, and the backend wakes once
// for connection and request instead of twice. When no first bytes are
// about to go, the caller sends the ACK at once (ReleaseHandshakeACK): the
// kernel would hold it for its delayed-ACK timer (up to 200 ms), and a
// server that speaks first would wait that long to accept.

// DialControl is SocketControl(l) for a socket about to connect: it also
// holds the handshake's last ACK. Whoever dials with it must call
// ReleaseHandshakeACK once connected.
func DialControl(l Liveness) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil
		}
		var err error
		if cerr := c.Control(func(fd uintptr) {
			if err = relayedSocketOptions(int(fd), l); err == nil {
				_ = rawio.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0) // an optimisation only
			}
		}); cerr != nil {
			return cerr
		}
		return err
	}
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
		_ = raw.Control(func(fd uintptr) {
			_ = rawio.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1)
		})
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
