package relay

import (
	"errors"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

func (l *Loop) start(client int, h Handler) {
	c := l.newConn(h, client, -1)
	c.tags[sideClient] = l.nextTag(sideClient)
	if err := l.register(client, c.slot, c.tags[sideClient]); err != nil {
		c.fail(err)
		return
	}
	c.writable[sideClient] = true
	c.dial()
}

// dial starts the current attempt, moving on to the next while a socket
// cannot even be opened; Failed once none is left.
func (c *LoopConn) dial() {
	l := c.l
	for c.attempt < len(l.o.DialTimeouts) {
		ep, err := c.h.Backend(c.attempt)
		if err != nil {
			c.fail(err)
			return
		}
		c.ep = ep
		fd, err := l.connect(ep)
		if err == nil {
			c.tags[sideBackend] = l.nextTag(sideBackend)
			err = l.register(fd, c.slot, c.tags[sideBackend])
			if err != nil {
				rawio.Close(fd)
			}
		}
		if err == nil {
			c.fds[sideBackend] = fd
			c.readable[sideBackend], c.writable[sideBackend] = false, false
			c.errHup[sideBackend] = false
			c.ackHeld = true
			l.timers.set(&c.timers[timerDial], mono.Add(l.now, l.o.DialTimeouts[c.attempt]))
			return
		}
		if LocalShortage(err) {
			// This node is out of descriptors or ports: no endpoint is at
			// fault, another would fail alike, and a retry would move the
			// client's affinity off an endpoint that did nothing wrong.
			c.fail(err)
			return
		}
		c.dialFailed(err)
	}
	c.fail(c.dialErr)
}

// LocalShortage reports a dial that failed for want of something on this
// node (descriptors, local ports, buffers, a usable source address of the
// endpoint's family: EADDRNOTAVAIL is both), not because of the endpoint.
func LocalShortage(err error) bool {
	if errors.Is(err, ErrDescriptorReserve) {
		return true
	}
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM, unix.EADDRNOTAVAIL:
		return true
	}
	return false
}

func (c *LoopConn) dialFailed(err error) {
	c.dialErr = err
	c.h.DialFailed(c.ep, err)
	c.attempt++
}

// newSocket opens a backend socket (a variable: tests run out of
// descriptors with it).
var newSocket = rawio.Socket

// connect opens a non-blocking socket with the options net's dialer would
// set (no delay) and TCP_INQ, and starts connecting. The liveness options
// come later (Liveness.settle).
func (l *Loop) connect(ep netip.AddrPort) (int, error) {
	family := unix.AF_INET
	if !ep.Addr().Unmap().Is4() {
		family = unix.AF_INET6
	}
	if ep.Addr().Zone() != "" {
		return -1, errors.New("relay: zoned backend address " + ep.String())
	}
	fd, err := newSocket(family)
	if err != nil {
		return -1, err
	}
	if InReserve(fd) {
		rawio.Close(fd)
		return -1, ErrDescriptorReserve
	}
	_ = rawio.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	_ = rawio.SetsockoptInt(fd, unix.SOL_TCP, unix.TCP_INQ, 1)
	// The client's first bytes carry the handshake's last ACK; connected
	// sends it when there are none (handshake_ack.go).
	holdHandshakeACK(fd)
	if err := rawio.Connect(fd, ep); err != nil && err != unix.EINPROGRESS {
		rawio.Close(fd)
		return -1, err
	}
	return fd, nil
}

// connected finishes a dial the backend socket's event ended. Only an
// event with an error or hang-up needs SO_ERROR's answer: writable alone
// is a connect that succeeded (a refused one reports EPOLLERR|EPOLLHUP,
// with or without EPOLLOUT), so the common case costs no system call.
func (c *LoopConn) connected(failed bool) {
	l := c.l
	if failed {
		if err := rawio.SocketError(c.fds[sideBackend]); err != nil {
			c.closeBackend()
			c.dialFailed(err)
			c.dial()
			return
		}
	}
	l.timers.stop(&c.timers[timerDial])
	c.state = stateRelaying
	if l.liveAfter > 0 {
		l.timers.set(&c.timers[timerLiveness], mono.Add(l.now, l.liveAfter))
	}
	c.h.Connected(c, c.ep)
	sent := c.in.Load()
	c.pump()
	if c.state == stateRelaying && !c.up.done && c.in.Load() == sent {
		// Nothing of the client's went out to carry the handshake's ACK,
		// which connect asked the kernel to hold: send it now. (Bytes
		// read are written at once on a new connection, so any carried
		// it.) The first write still ends the delayed-ACK mode (write).
		sendHandshakeACK(c.fds[sideBackend])
	}
}

func (c *LoopConn) closeBackend() {
	rawio.Close(c.fds[sideBackend])
	c.fds[sideBackend] = -1
}

// fail ends a connection that never reached a backend: the client gets a
// reset, so it cannot mistake "no backend" for an empty answer.
func (c *LoopConn) fail(err error) {
	c.l.timers.stop(&c.timers[timerDial])
	if c.fds[sideBackend] >= 0 {
		c.closeBackend()
	}
	// Told before the reset, so that a client (or a test) that saw the
	// reset finds the failure counted.
	c.h.Failed(err)
	resetClose(c.fds[sideClient])
	c.fds[sideClient] = -1
	c.release()
}
