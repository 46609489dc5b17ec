package relay

import (
	"errors"
	"net"
	"sync/atomic"
)

// The descriptor reserve. Every new descriptor takes the lowest number
// free (POSIX), so one numbered n proves 0..n-1 are all in use: a client
// or backend socket at or above the ceiling is one that would eat into the
// descriptors kept back, under RLIMIT_NOFILE, for the health and metrics
// servers, the rule writes' pipes and reading the manifests. Both data
// paths close such a socket and refuse its client at once, as when the
// socket cannot be opened at all (LocalShortage): a comparison per new
// descriptor, no system call. Without it, idle clients took every
// descriptor, /healthz could not accept (a liveness probe would restart
// the proxy), every rule write failed, and new clients hung in the
// listen backlog.
var descriptorCeiling atomic.Int64

// SetDescriptorCeiling makes descriptors numbered n or more off limits
// to connections (0: no ceiling). Set once at start; a new ceiling ends
// a squeeze of the pipe pool the old one caused.
func SetDescriptorCeiling(n int) {
	descriptorCeiling.Store(int64(n))
	pipes.unsqueeze()
}

// DescriptorCeiling is the ceiling SetDescriptorCeiling set (0: none).
func DescriptorCeiling() int { return int(descriptorCeiling.Load()) }

// InReserve tells whether fd, a descriptor just opened for a connection,
// is one of the reserve's: the connection must give it back and be
// refused.
func InReserve(fd int) bool {
	c := descriptorCeiling.Load()
	if c <= 0 {
		return false
	}
	if nearCeiling(fd) {
		pipes.squeeze() // pipes give way to clients (pipePool)
	}
	return int64(fd) >= c
}

// nearCeiling tells whether fd is in the top eighth of the descriptors
// below the ceiling (or above it), where splice pipes, only a speed-up,
// are not opened nor kept.
func nearCeiling(fd int) bool {
	c := descriptorCeiling.Load()
	return c > 0 && int64(fd) >= c-c/8
}

// ErrDescriptorReserve is the refusal of a connection whose socket fell in
// the descriptor reserve. LocalShortage reports it: no endpoint is at
// fault.
var ErrDescriptorReserve = errors.New("connections hold every descriptor not kept back for the proxy's servers, rule writes and manifests; raise the open-file limit (ulimit -n, systemd's LimitNOFILE)")

// ConnInReserve is InReserve for an accepted client of the goroutine relay,
// whose descriptor net keeps to itself. It costs no system call; without a
// ceiling, nothing.
func ConnInReserve(c *net.TCPConn) bool {
	if descriptorCeiling.Load() <= 0 {
		return false
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	in := false
	_ = raw.Control(func(fd uintptr) { in = InReserve(int(fd)) })
	return in
}
