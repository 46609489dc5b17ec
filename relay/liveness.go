package relay

import (
	"math"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// Liveness is how the kernel finds out that the peer of a proxied socket is
// gone: TCP keep-alive probes an idle connection, TCP_USER_TIMEOUT bounds
// how long sent data (or a probe) may go unacknowledged. Without either a
// client host that vanishes leaves its connection, two descriptors and two
// goroutines to the proxy forever: the backend's own keep-alive is answered
// by the proxy's kernel, and nothing ever asks the client.
type Liveness struct {
	// KeepAliveIdle is how long a connection is idle before the first
	// probe; 0 leaves keep-alive off.
	KeepAliveIdle time.Duration
	// KeepAliveInterval is the time between unanswered probes, and
	// KeepAliveCount how many go unanswered before the connection ends
	// (the kernel ignores the count when UserTimeout is set: the
	// connection then ends once probes went unanswered for UserTimeout).
	KeepAliveInterval time.Duration
	KeepAliveCount    int
	// UserTimeout: data (or a keep-alive probe) unacknowledged this long,
	// or a peer window that stayed closed this long, ends the connection;
	// 0 leaves the kernel's retransmission limit (~15 minutes).
	UserTimeout time.Duration
}

// The kernel's limits on the options (include/net/tcp.h MAX_TCP_KEEPIDLE,
// MAX_TCP_KEEPINTVL, MAX_TCP_KEEPCNT; TCP_USER_TIMEOUT is a C int of
// milliseconds): a larger value fails the setsockopt with EINVAL, and with
// it every proxy socket. The flags are checked against them at start.
const (
	MaxKeepAliveIdle     = 32767 * time.Second
	MaxKeepAliveInterval = 32767 * time.Second
	MaxKeepAliveCount    = 127
	MaxUserTimeout       = math.MaxInt32 * time.Millisecond
)

// Enabled reports whether Control sets anything.
func (l Liveness) Enabled() bool { return l.KeepAliveIdle > 0 || l.UserTimeout > 0 }

// Control sets the options on a TCP socket before it listens or connects
// (net.ListenConfig.Control, net.Dialer.Control); other networks are left
// alone. On a listening socket it costs nothing per connection: Linux
// copies these options to every socket accept returns, keep-alive timer
// armed (TestLivenessInheritedByAccept).
func (l Liveness) Control(network, _ string, c syscall.RawConn) error {
	if !strings.HasPrefix(network, "tcp") || !l.Enabled() {
		return nil
	}
	var err error
	cerr := c.Control(func(fd uintptr) { err = l.apply(int(fd)) })
	if cerr != nil {
		return cerr
	}
	return err
}

func (l Liveness) apply(fd int) error {
	if l.KeepAliveIdle > 0 {
		opts := []struct {
			level, name, value int
		}{
			{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, seconds(l.KeepAliveIdle)},
			{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, seconds(max(l.KeepAliveInterval, time.Second))},
			{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, max(l.KeepAliveCount, 1)},
			{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		}
		for _, o := range opts {
			if err := rawio.SetsockoptInt(fd, o.level, o.name, o.value); err != nil {
				return err
			}
		}
	}
	if l.UserTimeout > 0 {
		ms := max(int(l.UserTimeout/time.Millisecond), 1)
		err := rawio.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ms)
		switch {
		case err == unix.ENOPROTOOPT:
			// An MPTCP socket (--mptcp) takes no TCP_USER_TIMEOUT (kernel
			// 6.18); keep-alive still finds a dead peer. Failing here made
			// Go's MPTCP listener fall back to plain TCP, in silence.
			noUserTimeout.Do(func() {
				klog.InfoS("Multipath TCP sockets take no TCP_USER_TIMEOUT here: their dead peers are found by keep-alive alone")
			})
		case err != nil:
			return err
		}
	}
	return nil
}

// noUserTimeout says once that MPTCP sockets go without TCP_USER_TIMEOUT.
var noUserTimeout sync.Once

// settle is how long a dialled socket of the event loop relays before it
// gets the liveness options. Both only matter later: the first probe comes
// after KeepAliveIdle of idleness, and TCP_USER_TIMEOUT counts from when
// the oldest unacknowledged byte was sent, so set late it bounds the same
// stall. A connection that ends sooner (most short requests) then never
// pays for them: five system calls and a keep-alive timer armed and
// disarmed, 5 % of the loop's CPU per new connection. The cost: a first
// probe up to settle late.
func (l Liveness) settle() time.Duration {
	d := time.Second
	for _, t := range []time.Duration{l.KeepAliveIdle, l.UserTimeout} {
		if t > 0 {
			d = min(d, t/2)
		}
	}
	return d
}

// seconds rounds d up to whole seconds (the kernel's unit), at least 1.
func seconds(d time.Duration) int {
	return max(int((d+time.Second-1)/time.Second), 1)
}

// SocketControl returns the Control function (net.ListenConfig.Control,
// net.Dialer.Control) for a relayed TCP socket: l's options, and TCP_INQ,
// the kernel's hint after each read of what it left queued, which lets Auto
// wait without a read that only says EAGAIN. On a listening socket both
// cost nothing per connection (accepted sockets inherit them); a kernel
// without TCP_INQ (before 4.18) only loses the hint.
func SocketControl(l Liveness) func(network, address string, c syscall.RawConn) error {
	return socketControl(l, listening)
}

// socketKind is what socketControl's socket is for.
type socketKind uint8

const (
	listening      socketKind = iota
	dialing                   // a backend socket: refused in the descriptor reserve
	dialHoldingACK            // dialing, and it holds the handshake's last ACK
)

// socketControl is SocketControl, DialControl or BackendControl as kind
// says.
func socketControl(l Liveness, kind socketKind) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil
		}
		var err error
		if cerr := c.Control(func(fd uintptr) {
			if kind != listening && InReserve(int(fd)) {
				err = ErrDescriptorReserve // net closes the socket
				return
			}
			if err = relayedSocketOptions(int(fd), l); err == nil && kind == dialHoldingACK {
				holdHandshakeACK(int(fd))
			}
		}); cerr != nil {
			return cerr
		}
		return err
	}
}

// relayedSocketOptions sets what SocketControl sets on a TCP socket (and
// ListenTCP on its own): l's options and TCP_INQ.
func relayedSocketOptions(fd int, l Liveness) error {
	if err := l.apply(fd); err != nil {
		return err
	}
	_ = rawio.SetsockoptInt(fd, unix.SOL_TCP, unix.TCP_INQ, 1) // a hint only
	return nil
}
