package loadbalancer

import "net/netip"

// eligibleEndpoints returns the addresses that may receive new traffic:
// the Ready endpoints, or, when none is Ready, the ones that are Serving and
// Terminating. The fallback is kube-proxy's: a Service whose pods are all
// shutting down keeps answering through them instead of refusing every
// connection. Duplicates (the same address listed by two EndpointSlices) are
// kept once, in first-seen order.
func eligibleEndpoints(eps []Endpoint) []netip.AddrPort {
	out := collect(eps, func(e Endpoint) bool { return e.Ready })
	if len(out) == 0 {
		out = collect(eps, func(e Endpoint) bool { return e.Serving && e.Terminating })
	}
	return out
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
