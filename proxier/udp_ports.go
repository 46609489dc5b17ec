package proxier

import (
	"math"
	"net/netip"
	"sync/atomic"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// udpDialTries is how many backend sockets a new session opens at most to
// find a local port not freed recently (the others are closed once it has
// one).
const udpDialTries = 8

// recentPorts remembers which local ports UDP sessions freed last. A
// session's backend socket is a connected UDP socket whose port the kernel
// picks at random from the ephemeral range, and a closed session's port is
// free at once: the next session to the same endpoint could get it, and a
// reply the endpoint sent the closed session late (a DNS answer slower than
// --udp-timeout, or any answer to a session evicted at the cap) arrived on
// the new session's socket and was relayed to its client, another one. A
// new session passes over the ports freed within the last window frees
// (a quarter of the ephemeral ports: seconds of sessions at the caps' rate,
// minutes at a node's usual one), and so a freed port is handed out again
// only once many others were. Shared by every UDP service port; lock-free.
type recentPorts struct {
	window uint32
	seq    atomic.Uint32
	// freed[port] is the seq at which port was last freed, 0 never.
	freed [1 << 16]atomic.Uint32
}

// newRecentPorts makes the memory of a window of frees: a quarter of the
// ephemeral ports, so three quarters of them are always there to take
// (half of them at most hold sessions: udpPortShare). nil (nothing
// remembered) when the range is unknown.
func newRecentPorts(ephemeral int) *recentPorts {
	if ephemeral < 4 {
		return nil
	}
	return &recentPorts{window: uint32(ephemeral / 4)}
}

// noteFreed records that a session's socket holding port was closed.
func (r *recentPorts) noteFreed(port uint16) {
	if r == nil || port == 0 {
		return
	}
	seq := r.seq.Add(1)
	if seq == 0 { // wrapped: 0 means never
		seq = r.seq.Add(1)
	}
	r.freed[port].Store(seq)
}

// age is how many ports were freed since port was (MaxUint32: never).
func (r *recentPorts) age(port uint16) uint32 {
	f := r.freed[port].Load()
	if f == 0 {
		return math.MaxUint32
	}
	return r.seq.Load() - f
}

func (r *recentPorts) recent(port uint16) bool {
	return r != nil && port != 0 && r.age(port) < r.window
}

// dialUDPSession opens a session's backend socket connected to ep (see
// dialUDPBackend) and returns it with its local port. A socket whose port
// was freed recently is held while another is opened, so the kernel cannot
// hand the same port out again, up to udpDialTries; then the one whose port
// was freed longest ago is kept, and the rest closed.
func dialUDPSession(ep netip.AddrPort, recent *recentPorts) (int, uint16, error) {
	fd, err := dialUDPBackend(ep)
	if err != nil {
		return fd, 0, err
	}
	port := localPort(fd)
	if !recent.recent(port) {
		return fd, port, nil
	}
	// Held in an array, closed at the end: a slice and a deferred closure
	// cost a new session two allocations more.
	var held [udpDialTries - 1]int
	n := 0
	bestAge := recent.age(port)
	for range udpDialTries - 1 {
		next, err := dialUDPBackend(ep)
		if err != nil {
			break // descriptors or ports are short: the best so far
		}
		p := localPort(next)
		if !recent.recent(p) {
			held[n], n = fd, n+1
			fd, port = next, p
			break
		}
		if a := recent.age(p); a > bestAge {
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

// localPort is the port a socket is bound to, 0 if unknown (read without
// allocating: unix.Getsockname's sockaddrs cost a session two).
func localPort(fd int) uint16 {
	local, err := rawio.LocalAddr(fd)
	if err != nil {
		return 0
	}
	return local.Port()
}
