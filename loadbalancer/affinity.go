package loadbalancer

import (
	"net/netip"
	"time"
)

// affinityEntry is where one client is pinned and when it last used the pin.
type affinityEntry struct {
	endpoint netip.AddrPort
	lastUsed time.Time
}

// expired applies the session-affinity timeout, counted from the LAST use.
// ">=" matches the legacy proxier, which compared whole seconds: with a 3 s
// timeout a client back after 1 s (or 2 s) keeps its endpoint, one back after
// 3 s or more is balanced afresh.
func (e affinityEntry) expired(now time.Time, timeout time.Duration) bool {
	return now.Sub(e.lastUsed) >= timeout
}

// evictSample is how many affinity entries Next inspects, and deletes when
// expired, each time it inserts or overwrites an entry.
//
// Why this bounds the table without Sweep: only inserts grow the map, and
// each insert looks at evictSample entries starting from the random position
// Go's map iteration begins at. If a fraction f of the table is expired, an
// insert removes evictSample*f entries on average, which outpaces the one it
// adds as soon as f > 1/evictSample. So even if Sweep never runs, expired
// entries stay at about the number of live ones; the table is at most about
// twice the clients seen within one timeout. Sticky hits (the common case)
// skip this, so they stay cheap, and the cost per insert is constant, unlike
// a full scan.
const evictSample = 2

// affinityTable maps client IP to its pinned endpoint. Keys are netip.Addr
// values (comparable, no allocation), so lookups and refreshes on the hot
// path do not allocate. Not safe for concurrent use; ServicePort locks it.
type affinityTable map[netip.Addr]affinityEntry

// evictSome deletes up to evictSample expired entries among the first
// evictSample it visits (deleting during range is allowed in Go).
func (t affinityTable) evictSome(now time.Time, timeout time.Duration) {
	visited := 0
	for ip, e := range t {
		if e.expired(now, timeout) {
			delete(t, ip)
		}
		visited++
		if visited == evictSample {
			return
		}
	}
}

// sweep deletes every expired entry and returns how many it deleted.
func (t affinityTable) sweep(now time.Time, timeout time.Duration) int {
	n := 0
	for ip, e := range t {
		if e.expired(now, timeout) {
			delete(t, ip)
			n++
		}
	}
	return n
}

// dropUnless deletes the entries whose endpoint is not in keep, so those
// clients are balanced afresh onto a survivor on their next connection.
func (t affinityTable) dropUnless(keep addrSet) {
	for ip, e := range t {
		if _, ok := keep[e.endpoint]; !ok {
			delete(t, ip)
		}
	}
}
