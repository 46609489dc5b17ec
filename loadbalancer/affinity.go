package loadbalancer

import (
	"math"
	"net/netip"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// affinityEntry is where one client is pinned and when it last used the pin.
type affinityEntry struct {
	endpoint netip.AddrPort
	lastUsed time.Time
	// failed: the endpoint failed this client after Next returned it
	// (Failed), so the next pick re-pins as a retry does.
	failed bool
}

// expired applies the session-affinity timeout, counted from the LAST use.
// ">=" matches the legacy proxier, which compared whole seconds: with a 3 s
// timeout a client back after 1 s (or 2 s) keeps its endpoint, one back after
// 3 s or more is balanced afresh.
func (e affinityEntry) expired(now time.Time, timeout time.Duration) bool {
	return now.Sub(e.lastUsed) >= timeout
}

// DefaultMaxAffinityEntries is the default cap on one service port's
// affinity table. kube-proxy's iptables mode keeps ClientIP affinity in
// xt_recent lists of 100 entries per endpoint (ip_list_tot) and forgets the
// least recently used client beyond that; 10,000 per service port is that
// bound for a 100-endpoint Service, 100 times it for a single endpoint, and
// about 2 MiB of memory (measured: TestAffinityEntryCost), so forged sources
// or rotating IPv6 addresses cannot grow a table past what a node can hold.
const DefaultMaxAffinityEntries = 10000

// expireBatch is how many expired entries Next deletes from the least
// recently used end each time it inserts or overwrites an entry.
//
// Entries are kept in order of last use and each write stamps the clock's
// current time and moves the entry to the front, so the expired entries are
// exactly the oldest ones: deleting expireBatch of them per insert outpaces
// the one insert, and expired entries cannot pile up even if Sweep never
// runs. The batch bounds the work of one insert.
const expireBatch = 2

// affinityTable maps client IP to its pinned endpoint, least recently used
// last, holding at most its cap: inserting a new client into a full table
// evicts the least recently used one (as xt_recent does). Keys are
// netip.Addr values (comparable, no allocation), so lookups and refreshes
// on the hot path do not allocate. Not safe for concurrent use;
// ServicePort locks it.
type affinityTable struct {
	lru *simplelru.LRU[netip.Addr, affinityEntry]
}

// newAffinityTable returns an empty table holding at most maxEntries; 0 (or
// less) means no cap.
func newAffinityTable(maxEntries int) *affinityTable {
	if maxEntries <= 0 {
		maxEntries = math.MaxInt
	}
	lru, err := simplelru.NewLRU[netip.Addr, affinityEntry](maxEntries, nil)
	if err != nil {
		panic(err) // only for a size <= 0, excluded above
	}
	return &affinityTable{lru: lru}
}

func (t *affinityTable) get(ip netip.Addr) (affinityEntry, bool) { return t.lru.Peek(ip) }

// put writes ip's entry and makes it the most recently used; it reports
// whether the cap evicted another client to make room.
func (t *affinityTable) put(ip netip.Addr, e affinityEntry) (evicted bool) {
	return t.lru.Add(ip, e)
}

// len is 0 for a nil table (a port without affinity).
func (t *affinityTable) len() int {
	if t == nil {
		return 0
	}
	return t.lru.Len()
}

// expireOldest deletes up to n expired entries, least recently used first,
// and returns how many it deleted. It stops at the first live entry: every
// entry after it was used later.
func (t *affinityTable) expireOldest(now time.Time, timeout time.Duration, n int) int {
	deleted := 0
	for deleted < n {
		_, e, ok := t.lru.GetOldest()
		if !ok || !e.expired(now, timeout) {
			break
		}
		t.lru.RemoveOldest()
		deleted++
	}
	return deleted
}

// sweep deletes every expired entry and returns how many it deleted.
func (t *affinityTable) sweep(now time.Time, timeout time.Duration) int {
	return t.expireOldest(now, timeout, math.MaxInt)
}

// dropUnless deletes the entries whose endpoint is not in keep, so those
// clients are balanced afresh onto a survivor on their next connection.
func (t *affinityTable) dropUnless(keep addrSet) {
	for _, ip := range t.lru.Keys() {
		e, _ := t.lru.Peek(ip)
		if _, ok := keep[e.endpoint]; !ok {
			t.lru.Remove(ip)
		}
	}
}

// copyOut returns every client and its entry, least recently used first.
// It is the only part of a Snapshot done under the port's lock: two slice
// copies, no filtering, formatting or sorting.
func (t *affinityTable) copyOut() ([]netip.Addr, []affinityEntry) {
	return t.lru.Keys(), t.lru.Values()
}
