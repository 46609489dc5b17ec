package loadbalancer

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"k8s.io/utils/clock"
)

// LoadBalancer holds the ServicePort of every service port the proxier
// knows. Its map lock is taken by the control plane only (Set*, Delete,
// Sweep, Snapshot, ServicePort lookups); the data path calls Next on a
// cached *ServicePort and never touches it.
type LoadBalancer struct {
	clk     clock.PassiveClock
	limits  Limits
	shuffle func([]netip.AddrPort) // tests replace it to get a known order

	mu    sync.RWMutex
	ports map[ServicePortName]*ServicePort
}

// New returns an empty balancer reading time from clk and holding to limits.
func New(clk clock.PassiveClock, limits Limits) *LoadBalancer {
	return &LoadBalancer{
		clk:     clk,
		limits:  limits,
		shuffle: shuffleAddrs,
		ports:   make(map[ServicePortName]*ServicePort),
	}
}

// KeepOrder makes service ports created from now on cycle through their
// endpoints in the order given instead of a shuffled one, so that a plan
// (`explain`) prints the same order on every run. Call it before the first
// ServicePort.
func (lb *LoadBalancer) KeepOrder() { lb.shuffle = func([]netip.AddrPort) {} }

func shuffleAddrs(a []netip.AddrPort) {
	rand.Shuffle(len(a), func(i, j int) { a[i], a[j] = a[j], a[i] })
}

// ServicePort returns the state of svc, creating it when missing. Asking for
// the handle counts as the Service side being present (a proxy socket exists
// only for a Service), so the pointer stays valid until DeleteServicePort,
// even if the endpoints drop to none meanwhile.
func (lb *LoadBalancer) ServicePort(svc ServicePortName) *ServicePort {
	lb.mu.RLock()
	sp, ok := lb.ports[svc]
	ready := ok && sp.hasService
	lb.mu.RUnlock()
	if ready {
		return sp
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	sp = lb.getOrCreateLocked(svc)
	sp.hasService = true
	return sp
}

func (lb *LoadBalancer) getOrCreateLocked(svc ServicePortName) *ServicePort {
	sp, ok := lb.ports[svc]
	if !ok {
		sp = newServicePort(lb.clk, lb.shuffle, lb.limits.MaxAffinityEntries)
		lb.ports[svc] = sp
	}
	return sp
}

// forgetIfUnusedLocked removes svc once it has neither a Service nor
// endpoints, so the map tracks the cluster and nothing else.
func (lb *LoadBalancer) forgetIfUnusedLocked(svc ServicePortName, sp *ServicePort) {
	if !sp.hasService && !sp.hasEndpoints {
		delete(lb.ports, svc)
	}
}

// SetAffinity records the Service side (sessionAffinity) of svc. A change of
// timeout alone applies at once to existing entries (kubernetes#107398);
// switching to None clears the table. A zero Timeout with ClientIP means
// DefaultAffinityTimeout.
func (lb *LoadBalancer) SetAffinity(svc ServicePortName, p AffinityPolicy) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	sp := lb.getOrCreateLocked(svc)
	sp.hasService = true
	sp.setAffinity(p)
}

// SetFamiliesApart records whether svc's Service is dual-stack: then a
// client is served only by endpoints of its own family, and one whose
// family has none gets ErrNoEndpoints, as from kube-proxy's per-family
// proxiers; otherwise the endpoints serve clients of either family.
func (lb *LoadBalancer) SetFamiliesApart(svc ServicePortName, apart bool) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	sp := lb.getOrCreateLocked(svc)
	sp.hasService = true
	sp.mu.Lock()
	sp.familiesApart = apart
	sp.mu.Unlock()
}

// SetEndpoints replaces the endpoints of svc (the EndpointSlice side) and
// reports whether the eligible set changed. Eligible are the Ready
// endpoints or, in a family none of whose endpoints is Ready, its Serving
// and Terminating ones (eligibleEndpoints). The
// same eligible set in another order changes nothing (cursor and pins kept);
// a real change reshuffles, restarts the cursor and unpins the clients of
// endpoints that left.
func (lb *LoadBalancer) SetEndpoints(svc ServicePortName, eps []Endpoint) bool {
	eligible := eligibleEndpoints(eps)
	lb.mu.Lock()
	defer lb.mu.Unlock()
	sp, ok := lb.ports[svc]
	if !ok {
		if len(eps) == 0 {
			return false
		}
		sp = lb.getOrCreateLocked(svc)
	}
	sp.hasEndpoints = len(eps) > 0
	changed := sp.setEndpoints(eligible)
	lb.forgetIfUnusedLocked(svc, sp)
	return changed
}

// DeleteServicePort forgets the Service side of svc: its affinity policy and
// table. The entry itself goes once it has no endpoints either.
func (lb *LoadBalancer) DeleteServicePort(svc ServicePortName) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	sp, ok := lb.ports[svc]
	if !ok {
		return
	}
	sp.hasService = false
	sp.setAffinity(AffinityPolicy{})
	lb.forgetIfUnusedLocked(svc, sp)
}

// Sweep deletes expired affinity entries of every service port and returns
// how many it deleted. The proxier calls it periodically; Next also evicts
// a few on its own, so the tables stay bounded even without it.
func (lb *LoadBalancer) Sweep() int {
	lb.mu.RLock()
	defer lb.mu.RUnlock()
	n := 0
	for _, sp := range lb.ports {
		n += sp.sweep()
	}
	return n
}

// Snapshot returns a copy of svc's state, and false when svc is unknown.
func (lb *LoadBalancer) Snapshot(svc ServicePortName) (Snapshot, bool) {
	lb.mu.RLock()
	sp, ok := lb.ports[svc]
	lb.mu.RUnlock()
	if !ok {
		return Snapshot{}, false
	}
	return sp.Snapshot(), true
}

// ServicePortNames lists the known service ports, sorted by their String
// form so that debugging output is stable.
func (lb *LoadBalancer) ServicePortNames() []ServicePortName {
	lb.mu.RLock()
	names := make([]ServicePortName, 0, len(lb.ports))
	for name := range lb.ports {
		names = append(names, name)
	}
	lb.mu.RUnlock()
	slices.SortFunc(names, func(a, b ServicePortName) int {
		if c := strings.Compare(a.String(), b.String()); c != 0 {
			return c
		}
		return strings.Compare(string(a.Protocol), string(b.Protocol))
	})
	return names
}

// AffinityStats returns, for every service port with ClientIP affinity,
// affinity entries or past evictions, its table size and eviction count
// (what /metrics shows: a ClientIP port's series are there at 0 from its
// start, as every other per-port series is, not from its first client).
func (lb *LoadBalancer) AffinityStats() map[ServicePortName]AffinityStats {
	lb.mu.RLock()
	defer lb.mu.RUnlock()
	out := make(map[ServicePortName]AffinityStats)
	for name, sp := range lb.ports {
		if st := sp.affinityStats(); st.ClientIP || st.Entries > 0 || st.Evicted > 0 {
			out[name] = st
		}
	}
	return out
}
