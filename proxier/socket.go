package proxier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// proxySocket is the listening side of one service port.
type proxySocket interface {
	// Port is the local port the socket listens on.
	Port() int
	// Start starts the socket's accept or read loop, on a goroutine of its
	// own, running until Close. A TCP socket on the event loops has none
	// (the loops accept), so no goroutine is started for it: 10,000 that
	// returned at once cost a first sync 18 ms of CPU.
	Start()
	// Close stops accepting; connections already proxied finish on their own.
	Close() error
}

// Dialer opens backend connections; tests swap it to inject failures.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// socketConfig is shared by every proxy socket of one proxier.
type socketConfig struct {
	dialer Dialer
	// faultDialer dials for faulted connections: it holds no handshake
	// ACK, which the faults' copies would not release (backendDialer).
	faultDialer      Dialer
	dialTimeouts     []time.Duration
	udpIdleTimeout   time.Duration
	halfCloseTimeout time.Duration
	// writeTimeout bounds a relay direction that cannot write (relay.Options).
	writeTimeout      time.Duration
	metrics           *Metrics
	acceptBackoffBase time.Duration
	// UDP session caps: per service port, and in total (shared budget).
	udpMaxSessionsPerPort int
	udpBudget             *udpBudget
	// tcpShares caps each TCP proxy socket's connections (tcp_share.go).
	tcpShares *tcpShares
	// udpPorts hands out sessions' local ports, passing over those
	// freed last (udp_ports.go); nil: the kernel picks, nothing
	// remembered.
	udpPorts *sessionPorts
	// conns lists live connections for /debug/connections.
	conns *connRegistry
	// lifetimes: each TCP port's max age and drain time (lifetime.go);
	// closeQuiet is the silence a connection must keep before either
	// closes it, closeDeadline how long past it a busy one is waited for.
	lifetimes     *lifetimes
	closeQuiet    time.Duration
	closeDeadline time.Duration
	// listen opens the proxy sockets (see tcpListenConfig), but for the
	// loops' TCP ones without MPTCP: relay.ListenTCP opens those, with
	// liveness, and the runtime's poller never holds them.
	listen    net.ListenConfig
	liveness  relay.Liveness
	multipath bool
	// loops relays fault-free TCP connections (--data-path=eventloop);
	// nil: a goroutine pair per connection.
	loops *relay.Group
	// unreachable answers UDP datagrams of ports without endpoints
	// (udp_unreachable.go).
	unreachable *unreachableSender
	// ownPortals are the destinations the proxy's rules capture, which
	// no dial to an endpoint may go to (ownportals.go); nil: none.
	ownPortals *ownPortals
	// deaf lists the TCP sockets that cannot listen again although their
	// fault port is up (tcp_refuse.go).
	deaf *deafSockets
}

// defaultDialTimeouts are the legacy proxier's: each attempt goes to the
// next endpoint, so one dead backend costs at most 250 ms, not a stall.
var defaultDialTimeouts = []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}

// tcpListenConfig disables Go's default TCP keep-alive setup on listening
// and accepted sockets: it costs setsockopt calls per connection (9 % of CPU
// in the measured naive proxy). Keep-alive and TCP_USER_TIMEOUT (l), and
// TCP_INQ (relay.SocketControl), are set once on the listening socket
// instead, and every accepted socket inherits them. Go (since 1.24) listens with Multipath TCP by default. For a
// plain-TCP client that costs nothing measurable (the kernel falls back at
// the handshake: BenchmarkTCPConnectRequest, process CPU per connect+request
// 180-217 us plain vs 194-223 us MPTCP), but an MPTCP client then sets up a
// full MPTCP connection to the proxy (with GODEBUG=multipathtcp=3, clients
// dialling MPTCP: 253-270 vs 299-387 us) that gains it nothing, since the
// backend side is plain TCP anyway. So MPTCP is opt-in (--mptcp).
func tcpListenConfig(multipath bool, l relay.Liveness) net.ListenConfig {
	lc := net.ListenConfig{KeepAlive: -1, Control: relay.SocketControl(l)}
	lc.SetMultipathTCP(multipath)
	return lc
}

// listenConfig holds ports that only need to be claimed (claim.go).
var listenConfig = tcpListenConfig(false, relay.Liveness{})

// newProxySocket listens for one service port. An unspecified bind address
// listens on IPv4 only (0.0.0.0, what the flag says) unless the service port
// has IPv6 addresses, which need a dual-stack socket: a v4-only socket
// avoids v4-mapped addresses and the IPv6 send path on every UDP reply.
func newProxySocket(name loadbalancer.ServicePortName, bind netip.Addr, port int, needIPv6 bool, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) (proxySocket, error) {
	host := ""
	family := "4"
	switch {
	case bind.IsValid() && !bind.IsUnspecified():
		host, family = bind.String(), ""
	case needIPv6 || bind.Is6():
		family = "" // dual-stack wildcard
	}
	// Formatted only for net's listeners: 10,000 loop sockets need none.
	addr := func() string { return net.JoinHostPort(host, strconv.Itoa(port)) }
	switch name.Protocol {
	case v1.ProtocolTCP:
		if cfg.loops != nil && !cfg.multipath {
			fd, at, err := relay.ListenTCP(netip.AddrPortFrom(bind, uint16(port)), family == "", cfg.liveness)
			if err != nil {
				return nil, err
			}
			sock := newLoopTCPProxySocket(name, fd, at, sp, fp, cfg)
			sock.numbered = port != 0
			return sock, nil
		}
		ln, err := cfg.listen.Listen(context.Background(), "tcp"+family, addr())
		if err != nil {
			return nil, err
		}
		sock, err := newTCPProxySocket(name, ln.(*net.TCPListener), sp, fp, cfg)
		if err != nil {
			ln.Close()
			return nil, err
		}
		sock.numbered = port != 0
		return sock, nil
	case v1.ProtocolUDP:
		pc, err := cfg.listen.ListenPacket(context.Background(), "udp"+family, addr())
		if err != nil {
			return nil, err
		}
		sock, err := newUDPProxySocket(name, pc.(*net.UDPConn), sp, fp, cfg)
		if err != nil {
			pc.Close()
			return nil, err
		}
		return sock, nil
	}
	return nil, fmt.Errorf("unsupported protocol %q", name.Protocol)
}

// isTemporaryAcceptError covers running out of descriptors or memory and
// the errors of one client (relay.ClientGone): the listener is still good,
// so back off and accept again instead of dying, and log nothing.
func isTemporaryAcceptError(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) ||
		relay.ClientGone(err)
}

func clientAddr(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	case *net.UDPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// closer closes a proxy socket once and tells its loops, which treat an
// error after Close as the end rather than as a failure.
type closer struct {
	once   *sync.Once
	closed chan struct{}
}

func newCloser() closer { return closer{once: &sync.Once{}, closed: make(chan struct{})} }

func (c closer) closeWith(closeSocket func() error) error {
	var err error
	c.once.Do(func() {
		close(c.closed)
		err = closeSocket()
	})
	return err
}

func (p *Proxier) listenHost() string {
	if b := p.opts.BindAddress; b.IsValid() && !(b.IsUnspecified() && p.unsupportedFamily() == ipv6Family) {
		// "::" too: sockets then listen on every address of both
		// families, which "0.0.0.0" (shown for it before) hid.
		return b.String()
	}
	return "0.0.0.0"
}

// listenAddrOf is where info's sockets listen (newProxySocket): on the
// wildcard address a port with IPv6 addresses listens in both families,
// so "::", not the "0.0.0.0" of --bind-address. Without IPv6 portals (no
// IPv6 netfilter on the node) the wildcard is IPv4's, "::" of the flag
// too, as kube-proxy serves nothing in a family it has no proxier for:
// IPv6 has no guard rule then either, and a dual-stack socket let any
// IPv6 host reach the proxy port straight, past the portals,
// loadBalancerSourceRanges and the Local policy's split.
func (p *Proxier) listenAddrOf(info *servicePortInfo) netip.Addr {
	b := p.opts.BindAddress
	switch {
	case b.IsValid() && !b.IsUnspecified():
		return b
	case p.unsupportedFamily() == ipv6Family:
		return netip.IPv4Unspecified()
	case info.hasIPv6() || b.Is6():
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

func (p *Proxier) listenHostOf(info *servicePortInfo) string { return p.listenAddrOf(info).String() }

// listensIn says in which families info's sockets listen: "::" in both,
// any other address in its own.
func (p *Proxier) listensIn(info *servicePortInfo) (v4, v6 bool) {
	a := p.listenAddrOf(info)
	if a.IsUnspecified() && a.Is6() {
		return true, true
	}
	return a.Unmap().Is4(), a.Is6() && !a.Is4In6()
}

// backendDialer is the goroutine relay's dialer. Go's own keep-alive setup
// is off (it would set the options after connect, one call each); l's
// options are set before connect, with the handshake's last ACK held for
// the client's first bytes (relay.DialControl; serve releases it). Each
// attempt's relay.Attempt gets its socket, to ask whether the backend
// answered before it ends the attempt.
func backendDialer(l relay.Liveness) *net.Dialer {
	return &net.Dialer{KeepAlive: -1, ControlContext: relay.AttemptControl(relay.DialControl(l))}
}

// faultedBackendDialer is backendDialer for faulted connections, without
// the held ACK: the faults' copies write the first bytes, and only the
// built-in copy takes the socket out of the delayed-ACK mode that held it
// (relay.Conn.BackendHoldsACK), which left a Nagle backend's answer in
// two writes 40 ms late.
func faultedBackendDialer(l relay.Liveness) *net.Dialer {
	return &net.Dialer{KeepAlive: -1, ControlContext: relay.AttemptControl(relay.BackendControl(l))}
}
