package loadbalancer

import (
	"net/netip"
	"testing"
)

func TestGenerationMovesOnlyWithTheEligibleSet(t *testing.T) {
	lb, _ := newTestBalancer(t)
	name := svcName("dns")
	sp := lb.ServicePort(name)
	a, b := backend(1), backend(2)
	eps := func(as ...netip.AddrPort) []Endpoint {
		var out []Endpoint
		for _, a := range as {
			out = append(out, Endpoint{Addr: a, Ready: true, Serving: true})
		}
		return out
	}
	for _, s := range []struct {
		name            string
		set             []netip.AddrPort
		moved           bool
		serves, refuses []netip.AddrPort
	}{
		{"first set", []netip.AddrPort{a}, true, []netip.AddrPort{a}, []netip.AddrPort{b}},
		{"same set", []netip.AddrPort{a}, false, []netip.AddrPort{a}, []netip.AddrPort{b}},
		{"a replaced by b", []netip.AddrPort{b}, true, []netip.AddrPort{b}, []netip.AddrPort{a}},
		{"a added", []netip.AddrPort{b, a}, true, []netip.AddrPort{a, b}, nil},
		{"same set, other order", []netip.AddrPort{a, b}, false, []netip.AddrPort{a, b}, nil},
		{"none", nil, true, nil, []netip.AddrPort{a, b}},
	} {
		before := sp.Generation()
		lb.SetEndpoints(name, eps(s.set...))
		if moved := sp.Generation() != before; moved != s.moved {
			t.Errorf("%s: generation moved = %v, want %v", s.name, moved, s.moved)
		}
		for _, ep := range s.serves {
			if !sp.Serves(ep) {
				t.Errorf("%s: Serves(%v) = false, want true", s.name, ep)
			}
		}
		for _, ep := range s.refuses {
			if sp.Serves(ep) {
				t.Errorf("%s: Serves(%v) = true, want false", s.name, ep)
			}
		}
	}
}
