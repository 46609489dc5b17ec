package loadbalancer

import (
	"net/netip"
	"slices"
)

// Generation changes whenever the eligible endpoint set does. Holders of
// long-lived picks (UDP sessions) compare it per datagram, one atomic load,
// and ask Serves only when it moved.
func (sp *ServicePort) Generation() uint64 { return sp.generation.Load() }

// Serves reports whether ep is still an eligible endpoint.
func (sp *ServicePort) Serves(ep netip.AddrPort) bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return slices.Contains(sp.endpoints, ep)
}
