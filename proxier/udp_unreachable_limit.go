package proxier

import (
	"hash/maphash"
	"net/netip"
	"sync/atomic"
	"time"
)

// The errors one destination may get, as the kernel holds its own ICMP
// errors to each destination (net.ipv4.icmp_ratelimit, 1 s, with a burst
// of XRLIM_BURST_FACTOR, 6: kube-proxy's REJECT sends no more): the
// proxy's raw socket is not held to them. With the global bound alone a
// flood from a forged source aimed every error the node may send, 1,000 a
// second, at that one address, and spent the errors every other client of
// every Service was owed.
const (
	unreachableDestinationInterval = time.Second
	unreachableDestinationBurst    = 6
	// unreachableDestinationSlots is how many buckets the destinations
	// share (8 bytes each). Two addresses in one bucket share its rate:
	// fewer errors, never more, for either; the seed is random, so which
	// addresses share cannot be chosen from outside.
	unreachableDestinationSlots = 4096
)

// destinationLimiter is a token bucket per destination address, hashed
// into a fixed table, lock-free: each slot holds the time its next error
// is due at the bucket's rate (the generic cell rate algorithm, GCRA), so
// a slot is one atomic word and a check one compare-and-swap.
type destinationLimiter struct {
	seed maphash.Seed
	due  [unreachableDestinationSlots]atomic.Int64
}

func newDestinationLimiter() *destinationLimiter {
	return &destinationLimiter{seed: maphash.MakeSeed()}
}

// allow reports whether an error may go to dst now (mono.Now), about a
// datagram that arrived at local, and if so counts it. An error to the
// node itself (a loopback client, or one whose address is where its
// datagram arrived: the node's own traffic) is not held, as the kernel
// does not hold its own to the loopback device.
func (d *destinationLimiter) allow(dst, local netip.Addr, now int64) bool {
	dst = dst.Unmap()
	if dst.IsLoopback() || dst == local.Unmap() {
		return true
	}
	b := dst.As16()
	slot := &d.due[maphash.Bytes(d.seed, b[:])%unreachableDestinationSlots]
	const interval, ahead = int64(unreachableDestinationInterval), int64(unreachableDestinationBurst-1) * int64(unreachableDestinationInterval)
	for {
		due := slot.Load()
		next := max(due, now)
		if next-now > ahead {
			return false // the burst is spent: due more than burst-1 intervals ahead
		}
		if slot.CompareAndSwap(due, next+interval) {
			return true
		}
	}
}
