package loadbalancer

import "net/netip"

// eligibleEndpoints returns the addresses that may receive new traffic:
// the Ready endpoints, or, when none is Ready, the ones that are Serving and
// Terminating. The fallback is kube-proxy's: a Service whose pods are all
// shutting down keeps answering through them instead of refusing every
// connection. It is decided per address family, as kube-proxy's per-family
// proxiers each categorize their own family's endpoints: a dual-stack
// Service whose IPv4 pods are all terminating while IPv6 ones are ready
// serves its IPv4 clients with the terminating IPv4 pods (the balancer
// keeps each family in its own round robin), where a decision over both
// families dropped them and sent the IPv4 clients to IPv6 endpoints.
// Duplicates (the same address listed by two EndpointSlices) are kept
// once, in first-seen order.
func eligibleEndpoints(eps []Endpoint) []netip.AddrPort {
	var ready [2]bool // by family: IPv4, IPv6
	for _, e := range eps {
		if e.Ready && e.Addr.IsValid() {
			ready[Family(e.Addr)] = true
		}
	}
	return collect(eps, func(e Endpoint) bool {
		return e.Ready || !ready[Family(e.Addr)] && e.Servable()
	})
}

// Servable reports whether e may take traffic at all: it is ready, or
// serving while terminating (eligible when its family has no ready one).
func (e Endpoint) Servable() bool { return e.Ready || e.Serving && e.Terminating }

// Family is 0 for an IPv4 (or IPv4-mapped) address, 1 for IPv6: the index
// of per-family decisions (here and in the proxier's topology hints).
func Family(a netip.AddrPort) int {
	if a.Addr().Unmap().Is6() {
		return 1
	}
	return 0
}

func collect(eps []Endpoint, keep func(Endpoint) bool) []netip.AddrPort {
	var out []netip.AddrPort
	seen := make(map[netip.AddrPort]struct{}, len(eps))
	for _, e := range eps {
		if !keep(e) || !e.Addr.IsValid() {
			continue
		}
		if _, dup := seen[e.Addr]; dup {
			continue
		}
		seen[e.Addr] = struct{}{}
		out = append(out, e.Addr)
	}
	return out
}

// addrSet is a set of endpoint addresses, used to compare eligible sets
// regardless of order and to find affinity entries whose endpoint went away.
type addrSet map[netip.AddrPort]struct{}

func newAddrSet(addrs []netip.AddrPort) addrSet {
	s := make(addrSet, len(addrs))
	for _, a := range addrs {
		s[a] = struct{}{}
	}
	return s
}

// equalTo reports whether addrs (duplicate-free) holds exactly the members of s.
func (s addrSet) equalTo(addrs []netip.AddrPort) bool {
	if len(s) != len(addrs) {
		return false
	}
	for _, a := range addrs {
		if _, ok := s[a]; !ok {
			return false
		}
	}
	return true
}
