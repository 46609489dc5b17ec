package proxier

import (
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// udpDialTries is how many backend sockets a new session opens at most to
// find a local port not freed recently when the kernel picks its port (the
// others are closed once it has one).
const udpDialTries = 8

// udpBindTries is how many ports of the range a new session's socket is
// offered (passing over those freed recently, and trying to bind the rest)
// before the kernel is left to pick.
const udpBindTries = 16

// udpPortsReread is how often the ephemeral range and its reserved ports
// are read again, so that a change of either reaches new sessions.
const udpPortsReread = 10 * time.Second

// sessionPorts hands out the local ports of UDP sessions' backend sockets.
// A closed session's port is free at once, and a reply its endpoint sent
// late (a DNS answer slower than --udp-timeout, or any answer to a session
// evicted at the cap) arrives on whatever socket holds the port next: were
// it the next session's to that endpoint, another client received it. So
// the proxier picks the port itself: at random from the ephemeral range
// less its reserved ports, as the kernel would (RFC 6056: a port an
// off-path sender cannot guess, so that it cannot forge an endpoint's
// answer; ports handed out in turn could be foretold by anyone who sees
// one of them), passing over the ports freed within the last window frees
// (a quarter of the range: seconds of sessions at the caps' rate, minutes
// at a node's usual one, recentPorts) and binding the socket to one no
// socket holds (bind fails on those). A freed port is so handed out again
// only once window others were freed. That costs a session a bind, and
// saves connect's own port search, the getsockname that read the kernel's
// pick, and the second socket a quarter of the sessions opened when that
// pick was a recent port. When no port is found within udpBindTries (the
// range held by others, bind refused) the kernel picks, and a socket on a
// recent port is held while another is opened, up to udpDialTries. Shared
// by every UDP service port; lock-free.
type sessionPorts struct {
	recentPorts
	// ports is the ephemeral range less its reserved ports (nil: unknown,
	// the kernel picks).
	ports atomic.Pointer[[]uint16]
	// read is the range as the kernel tells it; readAt (mono.Now) is when
	// it is read again, kernel what it said last.
	read   func() (kernelPorts, error)
	readAt atomic.Int64
	kernel kernelPorts // guarded by winning readAt's swap
	// bindTo is rawio.Bind (a test's stand-in otherwise).
	bindTo func(fd int, ep netip.AddrPort, family int) error
}

// recentPorts remembers which local ports UDP sessions freed last.
type recentPorts struct {
	window atomic.Uint32 // 0: nothing remembered
	seq    atomic.Uint32
	// seqFreed[port] is the seq at which port was last freed, 0 never.
	seqFreed [1 << 16]atomic.Uint32
}

// newSessionPorts reads the range with read (readKernelPortsFromProc, on
// the thread of the namespace the sockets are opened in) now and every
// udpPortsReread.
func newSessionPorts(read func() (kernelPorts, error), now int64) *sessionPorts {
	sp := &sessionPorts{read: read, bindTo: rawio.Bind}
	sp.reread(now)
	return sp
}

// reread takes the range the kernel now says, if it changed: the ports to
// hand out, and the window of frees passed over (a quarter of them, so
// three quarters are always there to take; half of them at most hold
// sessions: udpPortShare). Nothing is handed out when the range cannot be
// read, and nothing remembered when it is below 4 ports.
func (sp *sessionPorts) reread(now int64) {
	// Stored last: the next reader's swap of it orders sp.kernel.
	defer sp.readAt.Store(now + int64(udpPortsReread))
	kp, err := sp.read()
	if err != nil {
		kp = kernelPorts{}
	}
	if sp.ports.Load() != nil && kp.Ephemeral == sp.kernel.Ephemeral && slices.Equal(kp.Reserved, sp.kernel.Reserved) {
		return
	}
	sp.kernel = kp
	var ports []uint16
	for port := kp.Ephemeral.Base; port < kp.Ephemeral.Base+kp.Ephemeral.Size; port++ {
		if !kp.reserved(port) {
			ports = append(ports, uint16(port))
		}
	}
	if len(ports) >= 4 {
		sp.window.Store(uint32(len(ports) / 4))
	} else {
		sp.window.Store(0)
	}
	sp.ports.Store(&ports)
}

// count is how many ports sp hands out, the ephemeral range less its
// reserved ports: those bind(0) and connect() hand out too (0: unknown).
func (sp *sessionPorts) count() int {
	if p := sp.ports.Load(); p != nil {
		return len(*p)
	}
	return 0
}

// maybeReread reads the range again when udpPortsReread has passed; one
// caller does it (its swap keeps the others out until reread is done), the
// others go on with the ports as they were.
func (sp *sessionPorts) maybeReread(now int64) {
	if sp == nil {
		return
	}
	if at := sp.readAt.Load(); now >= at && sp.readAt.CompareAndSwap(at, math.MaxInt64) {
		sp.reread(now)
	}
}

// noteFreed records that a session's socket holding port was closed.
func (r *recentPorts) noteFreed(port uint16) {
	if port == 0 {
		return
	}
	seq := r.seq.Add(1)
	if seq == 0 { // wrapped: 0 means never
		seq = r.seq.Add(1)
	}
	r.seqFreed[port].Store(seq)
}

// age is how many ports were freed since port was (MaxUint32: never).
func (r *recentPorts) age(port uint16) uint32 {
	f := r.seqFreed[port].Load()
	if f == 0 {
		return math.MaxUint32
	}
	return r.seq.Load() - f
}

func (r *recentPorts) recent(port uint16) bool {
	return port != 0 && r.age(port) < r.window.Load()
}

// bind binds fd, a socket of family not bound yet, to a port of the range
// picked at random that is not recent and that no socket holds, and
// returns it; 0 when it found none within udpBindTries (or knows no
// range). math/rand/v2's generator is per thread and seeded by the
// runtime from the system's randomness: no lock, and not foretold.
func (sp *sessionPorts) bind(fd, family int) uint16 {
	if sp == nil {
		return 0
	}
	p := sp.ports.Load()
	if p == nil || len(*p) == 0 {
		return 0
	}
	ports := *p
	unspec := netip.IPv6Unspecified()
	if family == unix.AF_INET {
		unspec = netip.IPv4Unspecified()
	}
	for range udpBindTries {
		port := ports[rand.Uint32N(uint32(len(ports)))]
		if sp.recent(port) {
			continue
		}
		switch err := sp.bindTo(fd, netip.AddrPortFrom(unspec, port), family); err {
		case nil:
			return port
		case unix.EADDRINUSE:
			continue // held by a socket, ours or another's
		default:
			return 0 // refused: the kernel picks
		}
	}
	return 0
}

// dialUDPSession opens a session's backend socket connected to ep, on a
// port sessionPorts chose, and returns it with that port. When it chose
// none the kernel picks (dialUDPBackend), and a socket whose port was
// freed recently is held while another is opened, up to udpDialTries; then
// the one whose port was freed longest ago is kept, and the rest closed.
// That fallback is what keeps a late reply from another client (see
// sessionPorts) when bind gives no port and ports are remembered: bind
// refused (a cgroup bind hook, seccomp, an LSM: then the kernel picks every
// port, a recent one a quarter of the time), or udpBindTries picks all
// recent or held, as at the session cap (half the range held, a quarter
// recent: about one new session in a hundred, and the kernel's pick among
// the free half is recent half the time). With the range unknown or below
// 4 ports nothing is remembered and it never runs.
func dialUDPSession(ep netip.AddrPort, ports *sessionPorts) (int, uint16, error) {
	fd, port, err := dialUDPBackendFrom(ep, ports)
	if err != nil || port != 0 {
		return fd, port, err
	}
	port = localPort(fd)
	if !ports.recentOK(port) {
		return fd, port, nil
	}
	// Held in an array, closed at the end: a slice and a deferred closure
	// cost a new session two allocations more.
	var held [udpDialTries - 1]int
	n := 0
	bestAge := ports.age(port)
	for range udpDialTries - 1 {
		next, err := dialUDPBackend(ep)
		if err != nil {
			break // descriptors or ports are short: the best so far
		}
		p := localPort(next)
		if !ports.recentOK(p) {
			held[n], n = fd, n+1
			fd, port = next, p
			break
		}
		if a := ports.age(p); a > bestAge {
			held[n], n = fd, n+1
			fd, port, bestAge = next, p, a
		} else {
			held[n], n = next, n+1
		}
	}
	for _, h := range held[:n] {
		rawio.Close(h)
	}
	return fd, port, nil
}

// freed records that a session's socket holding port was closed.
func (sp *sessionPorts) freed(port uint16) {
	if sp != nil {
		sp.noteFreed(port)
	}
}

// recentOK is recent for a possibly nil sessionPorts.
func (sp *sessionPorts) recentOK(port uint16) bool {
	return sp != nil && sp.recent(port)
}

// localPort is the port a socket is bound to, 0 if unknown (read without
// allocating: unix.Getsockname's sockaddrs cost a session two).
func localPort(fd int) uint16 {
	local, err := rawio.LocalAddr(fd)
	if err != nil {
		return 0
	}
	return local.Port()
}

// dialUDPBackend opens a non-blocking socket connected to ep. A raw
// descriptor, not a net.UDPConn: the reply loop polls it itself, and it
// costs no Go memory beyond the session. Its system calls are raw ones
// (none blocks) and its address is encoded on the stack: a new session's
// sockaddrs were two allocations.
func dialUDPBackend(ep netip.AddrPort) (int, error) {
	fd, _, err := dialUDPBackendFrom(ep, nil)
	return fd, err
}

// dialUDPBackendFrom is dialUDPBackend from a port ports chose, which it
// returns (0: the kernel picked one at connect).
func dialUDPBackendFrom(ep netip.AddrPort, ports *sessionPorts) (int, uint16, error) {
	family := unix.AF_INET6
	if ep.Addr().Unmap().Is4() {
		family = unix.AF_INET
	}
	fd, err := rawio.DatagramSocket(family)
	if err != nil {
		return -1, 0, os.NewSyscallError("socket", err)
	}
	if relay.InReserve(fd) {
		rawio.Close(fd)
		return -1, 0, relay.ErrDescriptorReserve
	}
	enableRecvErr(fd, family) // an unreachable endpoint is told (udp_recverr.go)
	port := ports.bind(fd, family)
	if err := rawio.Connect(fd, ep); err != nil {
		rawio.Close(fd)
		return -1, 0, &net.OpError{Op: "dial", Net: "udp", Addr: net.UDPAddrFromAddrPort(ep), Err: os.NewSyscallError("connect", err)}
	}
	return fd, port, nil
}
