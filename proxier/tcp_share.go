package proxier

import (
	"errors"
	"net/netip"
	"sync/atomic"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// A TCP proxy socket's share of the connections' descriptors
// (--tcp-max-connections-per-port). Every connection holds two descriptors
// (client and backend) from its accept to its end, under one ceiling for the
// whole process (setDescriptorCeiling). Without a share, the clients of one
// Service — idle ones, or clients that closed and vanished while a
// slow_close or latency toxic holds their FIN — took every descriptor below
// it, and every other Service's new clients were reset at accept (sweep 15:
// 11,000 such clients of one Service held 18,750 descriptors of 20,000). By
// default a socket may hold a quarter of the ceiling in connections, half
// its descriptors, so a flooded Service leaves the other half to the rest:
// 245,760 connections per port under the usual limit of 1,048,576, far above
// what one Service's clients hold on one node (each backend connection also
// needs a local port of the ephemeral range per endpoint), 4,687 under a
// limit of 20,000. As UDP's per-port cap, the share is per proxy socket: a
// service port split by its traffic policies into two holds up to twice it.

// errPortConnectionLimit refuses a client of a socket that holds its share.
var errPortConnectionLimit = errors.New("the service port holds --tcp-max-connections-per-port connections (its share of the open-file limit); its new clients are reset until some end")

// tcpShare is the per-socket cap on connections (0: none) of the cap given
// (0: the default; negative: none) under an open-file limit of nofile.
func tcpShare(given int, nofile uint64) int64 {
	switch {
	case given > 0:
		return int64(given)
	case given < 0:
		return 0
	}
	return int64(max(1, connectionCeiling(int(min(nofile, 1<<30)))/4))
}

// tcpShares holds the cap the TCP proxy sockets read at each accept: the
// default follows the limit as the ceiling does (follow, at each sync).
type tcpShares struct {
	given int
	cap   atomic.Int64
}

func newTCPShares(given int) *tcpShares {
	s := &tcpShares{given: given}
	s.follow(ceilingLimit.Load())
	return s
}

// startLine says the cap as set, for LogLimits, or nil for one given.
func (s *tcpShares) startLine() *logLine {
	switch cap := s.cap.Load(); {
	case cap == 0:
		return &logLine{msg: "TCP connections per service port not capped (--tcp-max-connections-per-port=-1): only the open-file limit holds them"}
	case s.given == 0:
		return &logLine{msg: "TCP connections per service port capped at a quarter of the connections' descriptors (--tcp-max-connections-per-port): one Service's clients cannot take the others' descriptors",
			kv: []any{"nofile", ceilingLimit.Load(), "maxConnectionsPerPort", cap}}
	}
	return nil
}

// follow sets the cap for an open-file limit of nofile.
func (s *tcpShares) follow(nofile uint64) { s.cap.Store(tcpShare(s.given, nofile)) }

// admit counts a new client of the socket holding held connections, or says
// it is past the share (then nothing is counted). Every client admitted is
// released once, when its connection ends or fails.
func (s *tcpShares) admit(held *atomic.Int64) bool {
	n := held.Add(1)
	if cap := s.cap.Load(); cap > 0 && n > cap {
		held.Add(-1)
		return false
	}
	return true
}

// clientFailed counts a client that was refused or found no endpoint (err
// says why: the share and the descriptor ceiling counted apart) and
// reports it.
func (s *tcpProxySocket) clientFailed(from netip.AddrPort, err error) {
	s.failed.Inc()
	switch {
	case err == errPortConnectionLimit:
		s.atShare.Inc()
	case errors.Is(err, relay.ErrDescriptorReserve):
		s.atCeiling.Inc()
	}
	s.noBackend.report(s.label, from, err)
}
