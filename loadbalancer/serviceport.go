package loadbalancer

import (
	"cmp"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// ServicePort is the balancer state of one service port: its eligible
// endpoints in round-robin order, the cursor and the ClientIP affinity
// table. Proxy sockets keep the pointer and call Next on every new
// connection; its own mutex is the only lock Next takes.
type ServicePort struct {
	clk        clock.PassiveClock
	shuffle    func([]netip.AddrPort)
	maxClients int // cap of the affinity table; 0 = none

	mu        sync.Mutex
	endpoints []netip.AddrPort // eligible only, in round-robin order
	cursor    int              // index in endpoints of the next round-robin pick
	// A dual-stack service port's endpoints of both families: IPv4 ones
	// first (endpoints[:split]), each family with its own cursor, so a
	// client is served by endpoints of its own family, as kube-proxy's
	// per-family proxiers do (a backend may listen on one family only).
	// split is 0 unless both families are present; cursor then runs over
	// the IPv4 part and cursor6 over the IPv6 part.
	split   int
	cursor6 int
	// retryCursor and retryCursor6 are where a pick past failed
	// endpoints starts (pickPast), one per family as the cursors: such
	// picks take turns of their own, apart from the round robin's.
	retryCursor, retryCursor6 int
	// familiesApart: the Service is dual-stack, so a client is served only
	// by endpoints of its own family, none or not, as kube-proxy's
	// per-family proxiers each hold only their family's EndpointSlices.
	// A single-stack Service's endpoints serve any client that reaches
	// its proxy socket (a dual-stack socket's IPv6 loopback, say).
	familiesApart bool
	policy        AffinityPolicy
	clients       *affinityTable // nil unless policy.ClientIP
	// evicted counts clients the cap pushed out of the table (not those that
	// expired), for the evictions metric; it outlives policy changes.
	evicted uint64
	// generation counts endpoint-set changes (generation.go).
	generation atomic.Uint64

	// Lifecycle flags, guarded by LoadBalancer.mu rather than mu: only the
	// LoadBalancer reads or writes them, when deciding whether to forget
	// the entry.
	hasService   bool
	hasEndpoints bool
}

func newServicePort(clk clock.PassiveClock, shuffle func([]netip.AddrPort), maxClients int) *ServicePort {
	return &ServicePort{clk: clk, shuffle: shuffle, maxClients: maxClients}
}

// Next picks the endpoint for a new connection (TCP) or session (UDP) from
// clientIP.
//
// With ClientIP affinity and resetAffinity false, an unexpired entry is
// returned and its last-used time refreshed, so the timeout counts from the
// last use. Otherwise round robin picks, and with affinity the client's
// entry is (over)written; a new client of a full table evicts the least
// recently used one. resetAffinity is for the retry after a failed dial: the
// pinned endpoint is skipped (when there is another) and the client is
// re-pinned to the one picked.
//
// Entries always point at eligible endpoints (SetEndpoints drops the others),
// so Next need not check. It does not allocate once the client is known.
func (sp *ServicePort) Next(clientIP netip.Addr, resetAffinity bool) (netip.AddrPort, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()

	if sp.choices(clientIP) == 0 {
		return netip.AddrPort{}, ErrNoEndpoints
	}
	if !sp.policy.ClientIP {
		return sp.roundRobin(clientIP), nil
	}

	// A dual-stack listener reports IPv4 clients as ::ffff:a.b.c.d; unmap so
	// one client is one key whichever socket it came through.
	clientIP = clientIP.Unmap()
	now := sp.clk.Now()
	timeout := sp.policy.Timeout
	pinned, havePin := sp.clients.get(clientIP)
	if havePin && (sp.split > 0 || sp.familiesApart) && pinned.endpoint.Addr().Unmap().Is6() != clientIP.Is6() {
		// Pinned while the families mixed (a single-stack Service, or one
		// family's endpoints only); they are apart now: a pick of its own.
		havePin = false
	}
	resetAffinity = resetAffinity || pinned.failed
	if havePin && !resetAffinity && !pinned.expired(now, timeout) {
		pinned.lastUsed = now
		sp.clients.put(clientIP, pinned)
		return pinned.endpoint, nil
	}

	var ep netip.AddrPort
	if resetAffinity && havePin {
		// Another client's pick may have moved the cursor onto the
		// endpoint that just failed for this one: past it.
		failed := [1]netip.AddrPort{pinned.endpoint}
		ep = sp.pickPast(clientIP, failed[:])
	} else {
		ep = sp.roundRobin(clientIP)
	}
	sp.pinLocked(clientIP, ep, now)
	return ep, nil
}

// Retry picks the endpoint of clientIP's next dial attempt after its
// earlier attempts failed on tried: the next endpoint in the client's
// family that was not tried while another remains, in turns of its own
// (the round-robin cursor stays: pickPast), the client re-pinned
// there under ClientIP affinity. A retry through Next moved past the
// pinned endpoint only, and the round-robin cursor is shared: with other
// connections picking in between, a retry fell on the dead endpoint again
// (a live endpoint beside a dead one, 10 connections at a time: 21 of 400
// clients were reset after four attempts on the dead one).
func (sp *ServicePort) Retry(clientIP netip.Addr, tried []netip.AddrPort) (netip.AddrPort, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.choices(clientIP) == 0 {
		return netip.AddrPort{}, ErrNoEndpoints
	}
	ep := sp.pickPast(clientIP, tried)
	if sp.policy.ClientIP {
		sp.pinLocked(clientIP.Unmap(), ep, sp.clk.Now())
	}
	return ep, nil
}

// pickPast is the first endpoint of clientIP's family from the retry
// cursor on that is not in skip, and moves the retry cursor past it (the
// one at the round-robin cursor when every one is in skip). It leaves the
// round-robin cursor where it is: moved, it went back on the endpoint that
// had just failed whenever the pick was the one at the cursor, so with one
// dead endpoint beside one live one every new connection tried the dead
// one first. Nor does it start from that cursor: a pinned client's Next
// takes no turn, so under ClientIP affinity every client of an endpoint
// that died was re-pinned to the same one (all 100 of a dead endpoint's
// clients, of 4 endpoints), for the affinity timeout; the retry cursor
// spreads them over the others. mu is held; the family has endpoints.
func (sp *ServicePort) pickPast(clientIP netip.Addr, skip []netip.AddrPort) netip.AddrPort {
	lo, hi, cur := sp.familyRange(clientIP)
	retry := &sp.retryCursor
	if lo > 0 {
		retry = &sp.retryCursor6
	}
	for i, n := 0, hi-lo; i < n; i++ {
		at := lo + (*retry-lo+i)%n
		if ep := sp.endpoints[at]; !slices.Contains(skip, ep) {
			*retry = lo + (at-lo+1)%n
			return ep
		}
	}
	return sp.endpoints[*cur]
}

// pinLocked pins clientIP (unmapped) to ep as of now, first expiring a few
// of the oldest entries; a new client of a full table evicts the least
// recently used one. mu is held; the port has affinity.
func (sp *ServicePort) pinLocked(clientIP netip.Addr, ep netip.AddrPort, now time.Time) {
	sp.clients.expireOldest(now, sp.policy.Timeout, expireBatch)
	if sp.clients.put(clientIP, affinityEntry{endpoint: ep, lastUsed: now}) {
		sp.evicted++
	}
}

// Failed says that ep, which Next returned to clientIP, failed it after
// the pick: a UDP endpoint whose session drew ICMP port unreachable, found
// only when a reply was awaited. The client's next pick then re-pins as a
// retry after a failed dial does (moving past ep when there is another),
// where it found the pin to ep again and a client kept sending to a dead
// endpoint for as long as it kept trying. Nothing happens when the client
// is pinned elsewhere by now, or the port has no affinity.
func (sp *ServicePort) Failed(clientIP netip.Addr, ep netip.AddrPort) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.clients == nil {
		return
	}
	clientIP = clientIP.Unmap()
	if e, ok := sp.clients.get(clientIP); ok && e.endpoint == ep && !e.failed {
		// Stamped now, as every write is: the table is ordered by last
		// use, which expiry relies on.
		e.failed, e.lastUsed = true, sp.clk.Now()
		sp.clients.put(clientIP, e)
	}
}

// roundRobin returns the endpoint at the cursor of clientIP's family and
// advances it. Callers hold mu and have checked that endpoints is not empty.
func (sp *ServicePort) roundRobin(clientIP netip.Addr) netip.AddrPort {
	lo, hi, cur := sp.familyRange(clientIP)
	ep := sp.endpoints[*cur]
	*cur++
	if *cur == hi {
		*cur = lo
	}
	return ep
}

// familyRange is the part of endpoints that serves clientIP, and its
// cursor: all of them, unless both families are present, or the endpoints
// are of the other family and the families are kept apart (none).
func (sp *ServicePort) familyRange(clientIP netip.Addr) (lo, hi int, cursor *int) {
	if sp.split == 0 {
		if sp.familiesApart && len(sp.endpoints) > 0 && sp.endpoints[0].Addr().Unmap().Is6() != clientIP.Unmap().Is6() {
			return 0, 0, &sp.cursor // one family's endpoints, the other family's client
		}
		return 0, len(sp.endpoints), &sp.cursor
	}
	if clientIP.Unmap().Is6() {
		return sp.split, len(sp.endpoints), &sp.cursor6
	}
	return 0, sp.split, &sp.cursor
}

// choices is how many endpoints may serve clientIP.
func (sp *ServicePort) choices(clientIP netip.Addr) int {
	lo, hi, _ := sp.familyRange(clientIP)
	return hi - lo
}

// setEndpoints installs eligible (already filtered and duplicate-free) and
// reports whether the set changed. An unchanged set, in whatever order, keeps
// the cursor and every pin; a changed one is shuffled, so that proxies on
// different nodes do not all start on the same endpoint, and restarts the
// cursor.
func (sp *ServicePort) setEndpoints(eligible []netip.AddrPort) bool {
	next := newAddrSet(eligible) // built before locking: Next may be waiting
	sp.mu.Lock()
	defer sp.mu.Unlock()

	if next.equalTo(sp.endpoints) {
		return false
	}
	sp.shuffle(eligible)
	// IPv4 first, each family in shuffled order.
	slices.SortStableFunc(eligible, func(a, b netip.AddrPort) int {
		return cmp.Compare(a.Addr().Unmap().BitLen(), b.Addr().Unmap().BitLen())
	})
	sp.split = 0
	if n4 := slices.IndexFunc(eligible, func(a netip.AddrPort) bool { return a.Addr().Unmap().Is6() }); n4 > 0 {
		sp.split = n4
	}
	sp.endpoints = eligible
	sp.cursor, sp.cursor6 = 0, sp.split
	sp.retryCursor, sp.retryCursor6 = 0, sp.split
	sp.generation.Add(1)
	if sp.clients != nil {
		sp.clients.dropUnless(next)
	}
	return true
}

// setAffinity installs p. Entries only store the last-use time and the
// timeout is applied when they are read, so a new timeout governs existing
// entries at once (the legacy proxier kept the old one: kubernetes#107398).
func (sp *ServicePort) setAffinity(p AffinityPolicy) {
	p = normalizePolicy(p)
	sp.mu.Lock()
	defer sp.mu.Unlock()

	sp.policy = p
	switch {
	case !p.ClientIP:
		sp.clients = nil
	case sp.clients == nil:
		sp.clients = newAffinityTable(sp.maxClients)
	}
}

// normalizePolicy fills in the default timeout and zeroes the timeout of a
// policy without affinity, so that equal behaviour compares equal.
func normalizePolicy(p AffinityPolicy) AffinityPolicy {
	if !p.ClientIP {
		return AffinityPolicy{}
	}
	if p.Timeout <= 0 {
		p.Timeout = DefaultAffinityTimeout
	}
	return p
}

// sweep deletes the expired affinity entries and returns how many.
func (sp *ServicePort) sweep() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.clients == nil {
		return 0
	}
	return sp.clients.sweep(sp.clk.Now(), sp.policy.Timeout)
}

// Snapshot copies the state for debugging output: endpoints in round-robin
// order starting at the next pick, and the unexpired affinity entries sorted
// by client IP. Only the copy is made under the port's lock; filtering and
// sorting happen after it is released, so a large table does not hold up
// Next.
func (sp *ServicePort) Snapshot() Snapshot {
	sp.mu.Lock()
	s := Snapshot{Affinity: sp.policy, Evicted: sp.evicted}
	if n := len(sp.endpoints); n > 0 {
		s.Endpoints = make([]netip.AddrPort, 0, n)
		if sp.split == 0 {
			s.Endpoints = append(s.Endpoints, sp.endpoints[sp.cursor:]...)
			s.Endpoints = append(s.Endpoints, sp.endpoints[:sp.cursor]...)
		} else {
			// Each family from its own next pick, IPv4 first.
			s.Endpoints = append(s.Endpoints, sp.endpoints[sp.cursor:sp.split]...)
			s.Endpoints = append(s.Endpoints, sp.endpoints[:sp.cursor]...)
			s.Endpoints = append(s.Endpoints, sp.endpoints[sp.cursor6:]...)
			s.Endpoints = append(s.Endpoints, sp.endpoints[sp.split:sp.cursor6]...)
		}
	}
	var ips []netip.Addr
	var entries []affinityEntry
	if sp.clients != nil {
		ips, entries = sp.clients.copyOut()
	}
	now := sp.clk.Now()
	sp.mu.Unlock()

	for i, e := range entries {
		if e.expired(now, s.Affinity.Timeout) {
			continue
		}
		s.Clients = append(s.Clients, AffinityEntry{ClientIP: ips[i], Endpoint: e.endpoint, LastUsed: e.lastUsed})
	}
	slices.SortFunc(s.Clients, func(a, b AffinityEntry) int { return a.ClientIP.Compare(b.ClientIP) })
	return s
}

// affinityStats reads the table's size and eviction count.
func (sp *ServicePort) affinityStats() AffinityStats {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	st := AffinityStats{ClientIP: sp.policy.ClientIP, Evicted: sp.evicted}
	if sp.clients != nil {
		st.Entries = sp.clients.len()
	}
	return st
}
