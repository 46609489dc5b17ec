package proxier

import (
	"math/bits"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Default UDP session caps. Sessions alive at once ≈ new client ip:ports
// per second × --udp-timeout, and DNS clients use a fresh port per query:
// 16,384 per port holds 65,000 queries/s at the default 250 ms, far above
// what one node's pods ask, while a flood of forged sources costs at most
// 16,384 descriptors and ~7 MiB of Go memory on that port. The total is four
// such ports, so one flooded Service cannot take every session, and it is
// further held to half the descriptor limit (udpDescriptorShare) and to
// half the ephemeral ports (udpPortShare), which lower the default per-port
// cap with it: with the default range, 14,116 and 3,529 (about 14,000
// queries/s per port before the oldest idle sessions are closed early).
const (
	DefaultUDPMaxSessionsPerPort = 16384
	DefaultUDPMaxSessions        = 65536
)

// udpLimits turns the options into the per-port cap and the total budget,
// held to the descriptor limit and to the ephemeral ports, how many ports
// connect() can give a session's backend socket (the range less its
// reserved ports, as sessionPorts read them at start; 0: unknown). Set at
// start: a change of the range reaches the ports sessions bind
// (sessionPorts' re-read), not the caps. The line says caps held lower
// than given, for LogLimits (nil: none).
func udpLimits(o Options, ephemeral int) (int, *udpBudget, *logLine) {
	perPort, limit := o.UDPMaxSessionsPerPort, o.UDPMaxSessions
	if limit <= 0 {
		limit = DefaultUDPMaxSessions
	}
	nofile, ports := nofileLimit(), ephemeral
	capped, total := udpCaps(perPort, limit, nofile, ports)
	var line *logLine
	if total < limit {
		given := any(perPort)
		if perPort <= 0 {
			given = "default"
		}
		line = &logLine{msg: "UDP session caps held to half the open-file limit and half the ephemeral ports", kv: []any{"nofile", nofile,
			"ephemeralPorts", ports, "maxSessions", total, "maxSessionsPerPort", capped, "given", []any{limit, given}}}
	}
	return capped, newUDPBudget(total), line
}

// udpCaps holds the total to the descriptor share of nofile and the port
// share of the ephemeral ports (0: unknown, no bound), and the per-port
// cap to the total. When the share lowers the total, the default
// per-port cap (perPort 0) is lowered by the same factor: it exists so that
// one flooded Service cannot take every session, and left at 16,384 while
// a limit of 20,000 descriptors made the total 10,000, one port could hold
// them all, and every other port's new clients were dropped until the
// flood's sessions expired. A per-port cap given is the user's own share
// and is only held to the total: scaled too, a given 10 became 1 under the
// default total, and a Service with two clients evicted at every datagram.
func udpCaps(perPort, limit int, nofile uint64, ephemeral int) (int, int) {
	total := min(limit, udpDescriptorShare(nofile))
	if ephemeral > 0 {
		total = min(total, udpPortShare(ephemeral))
	}
	if perPort <= 0 {
		perPort = DefaultUDPMaxSessionsPerPort
		if total < limit {
			// perPort × total / limit in 128 bits; total < limit, so
			// the quotient fits.
			hi, lo := bits.Mul64(uint64(perPort), uint64(total))
			q, _ := bits.Div64(hi, lo, uint64(limit))
			perPort = max(1, int(q))
		}
	}
	return min(perPort, total), total
}

// udpDescriptorShare is how many descriptors UDP sessions may hold of a
// process limit of nofile: half, so a UDP flood leaves TCP (two per
// connection plus pooled pipes) room. Half of the limit, not of what is
// free: the listeners count against TCP's half, so with many service ports
// TCP may have much less. What keeps the proxy's own descriptors (servers,
// rule writes, manifests) free of both is the connection ceiling
// (setDescriptorCeiling): sessions' sockets stop at it as TCP's do.
func udpDescriptorShare(nofile uint64) int {
	return int(min(nofile/2, 1<<30))
}

// udpPortShare is how many sessions may hold a port of the ephemeral
// range's ephemeral ports: half. A session's backend socket is a connected
// UDP socket, whose local port is its own whatever its peer (the kernel
// picks it before the connect, across every address), so sessions beyond
// the range's ports could not open: connect fails with EAGAIN and the new
// client's datagram was dropped, on every UDP service port, with no idle
// session evicted, while the caps, 65,536 against the default range's
// 28,232 ports, were far away; and the node's own UDP clients (resolvers,
// NTP) found no source port either. Half stays for them, as half the
// descriptors stays for TCP, and at the cap a flooded port closes its own
// oldest idle session.
func udpPortShare(ephemeral int) int {
	return max(1, ephemeral/2)
}

// nofileLimit is the process's RLIMIT_NOFILE (Go raises the soft limit to
// the hard one at start), 1024 if it cannot be read.
func nofileLimit() uint64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur == unix.RLIM_INFINITY {
		return 1024
	}
	return r.Cur
}

// udpBudget counts the UDP sessions of every service port against the
// total cap: one atomic counter, so the data path takes no shared lock.
// holders is which ports hold the most, for making room at the cap.
type udpBudget struct {
	limit   int64
	used    atomic.Int64
	holders udpHolders
}

func newUDPBudget(limit int) *udpBudget { return &udpBudget{limit: int64(limit)} }

// acquire takes one session slot, false when the total cap is reached.
func (b *udpBudget) acquire() bool {
	if b.used.Add(1) > b.limit {
		b.used.Add(-1)
		return false
	}
	return true
}

func (b *udpBudget) release() { b.used.Add(-1) }

// udpHolderRanks is how many of the ports holding the most sessions a
// ranking keeps: the biggest gives up a session at the total cap, the
// next ones when none of the biggest's oldest is idle.
const udpHolderRanks = 4

// udpHolderRescan is how old a ranking may be before the next port at the
// total cap scans the ports again. A scan reads every UDP proxy socket's
// count (one atomic load each, no port's mutex): 10,000 ports take about a
// millisecond (BenchmarkUDPHolderRanking10k: 0.4-2 ms on a loaded 2-core
// machine), so ports meeting the cap thousands of times a second scan at
// most 10 times a second, 1-2 % of a core at the worst, and every other
// time costs a look at the last ranking. Within that time the ranking may be stale: a port that stopped
// being the biggest still gives up an idle session, one with none left is
// passed over for the next, and one that became the biggest since is not
// asked until the next scan.
const udpHolderRescan = 100 * time.Millisecond

// udpHolders is the last ranking of the UDP proxy sockets by sessions
// held. Read at the total cap only: the per-datagram path never touches it.
type udpHolders struct {
	ranking  atomic.Pointer[udpHolderRanking]
	scanning atomic.Bool
}

// udpHolderRanking is the ports holding the most sessions, the biggest
// first (nil past the last when there are fewer), as of a scan at mono
// time at.
type udpHolderRanking struct {
	at    int64
	ports [udpHolderRanks]*udpProxySocket
}

// biggest returns the ports holding the most sessions of reg's, from the
// last ranking, scanned again when it is older than udpHolderRescan. One
// port scans at a time; the others meanwhile use the last ranking (none
// before the first: their new clients are dropped, as before any).
func (h *udpHolders) biggest(reg *connRegistry, now int64) []*udpProxySocket {
	r := h.ranking.Load()
	if reg != nil && (r == nil || now-r.at >= int64(udpHolderRescan)) && h.scanning.CompareAndSwap(false, true) {
		r = rankUDPHolders(reg, now)
		h.ranking.Store(r)
		h.scanning.Store(false)
	}
	if r == nil {
		return nil
	}
	return r.ports[:]
}

// anyHoldsMore reports whether a port of the last ranking (biggest's)
// other than s holds more sessions than s now does: at the total cap that
// port gives up a session rather than s (makeRoomLocked). No port's mutex
// is taken, so s's may be held.
func (h *udpHolders) anyHoldsMore(reg *connRegistry, s *udpProxySocket, now int64) bool {
	mine := s.held.Load()
	for _, other := range h.biggest(reg, now) {
		if other != nil && other != s && other.held.Load() > mine {
			return true
		}
	}
	return false
}

// rankUDPHolders ranks reg's UDP proxy sockets by the sessions they hold.
func rankUDPHolders(reg *connRegistry, now int64) *udpHolderRanking {
	r := &udpHolderRanking{at: now}
	// -1: a port holding none is ranked too while there is room, so that
	// with a few ports every one is in the ranking, whatever it held at
	// the scan (two ports at a cap of 1 take the session from each other
	// in turn, each holding none when the other's client comes).
	held := [udpHolderRanks]int64{-1, -1, -1, -1}
	reg.udpSockets.Range(func(k, _ any) bool {
		s := k.(*udpProxySocket)
		n := s.held.Load()
		if n <= held[udpHolderRanks-1] {
			return true
		}
		i := udpHolderRanks - 1
		for ; i > 0 && n > held[i-1]; i-- {
			held[i], r.ports[i] = held[i-1], r.ports[i-1]
		}
		held[i], r.ports[i] = n, s
		return true
	})
	return r
}
