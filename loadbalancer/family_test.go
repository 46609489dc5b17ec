package loadbalancer

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// A service port with endpoints of both families keeps them apart, as
// kube-proxy's per-family proxiers do: an IPv4 client is served by IPv4
// endpoints only and an IPv6 client by IPv6 ones, each in fair round robin
// however their picks interleave. One family alone serves every client of
// a single-stack Service (TestFamiliesApartWithOneFamily: not of a
// dual-stack one).
func TestFamiliesServedByTheirOwnEndpoints(t *testing.T) {
	v4a, v4b, v4c := addr("10.0.0.1:80"), addr("10.0.0.2:80"), addr("10.0.0.3:80")
	v6a, v6b := addr("[fd00::1]:80"), addr("[fd00::2]:80")
	c4, c6, c4mapped := ip("10.1.0.1"), ip("fd01::1"), ip("::ffff:10.1.0.2")
	ep := func(a netip.AddrPort) Endpoint { return Endpoint{Addr: a, Ready: true, Serving: true} }
	tests := []struct {
		name      string
		endpoints []netip.AddrPort
		clients   []netip.Addr
		want      []netip.AddrPort
	}{
		{"mixed, interleaved clients", []netip.AddrPort{v6a, v4a, v6b, v4b, v4c},
			[]netip.Addr{c4, c6, c4, c6, c4mapped, c6, c4},
			[]netip.AddrPort{v4a, v6a, v4b, v6b, v4c, v6a, v4a}},
		{"IPv4 only serves IPv6 clients too", []netip.AddrPort{v4a, v4b},
			[]netip.Addr{c6, c4, c6}, []netip.AddrPort{v4a, v4b, v4a}},
		{"IPv6 only serves IPv4 clients too", []netip.AddrPort{v6a, v6b},
			[]netip.Addr{c4, c6, c4}, []netip.AddrPort{v6a, v6b, v6a}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, _ := newTestBalancer(t)
			name := svcName("dual")
			var eps []Endpoint
			for _, a := range tt.endpoints {
				eps = append(eps, ep(a))
			}
			lb.SetEndpoints(name, eps)
			sp := lb.ServicePort(name)
			for i, c := range tt.clients {
				if got := mustNext(t, sp, c, false); got != tt.want[i] {
					t.Fatalf("pick %d from %v = %v, want %v", i, c, got, tt.want[i])
				}
			}
			if got := sp.Snapshot().Endpoints; len(got) != len(tt.endpoints) {
				t.Fatalf("snapshot lists %v, want all %d endpoints", got, len(tt.endpoints))
			}
		})
	}
}

// With affinity, a retry after a failed dial moves past the pinned endpoint
// within the client's family only.
func TestFamilyAffinityRetryStaysInFamily(t *testing.T) {
	lb, _ := newTestBalancer(t)
	name := svcName("dual")
	lb.SetAffinity(name, clientIPPolicy(time.Hour))
	lb.SetEndpoints(name, []Endpoint{
		{Addr: addr("10.0.0.1:80"), Ready: true, Serving: true},
		{Addr: addr("[fd00::1]:80"), Ready: true, Serving: true},
		{Addr: addr("[fd00::2]:80"), Ready: true, Serving: true},
	})
	sp := lb.ServicePort(name)
	c6 := ip("fd01::1")
	first := mustNext(t, sp, c6, false)
	retry := mustNext(t, sp, c6, true)
	if !first.Addr().Is6() || !retry.Addr().Is6() || retry == first {
		t.Fatalf("IPv6 client: first %v, retry %v; want two different IPv6 endpoints", first, retry)
	}
	if got := mustNext(t, sp, ip("10.1.0.1"), true); got != addr("10.0.0.1:80") {
		t.Fatalf("IPv4 client's retry with one IPv4 endpoint got %v", got)
	}
}

// The fallback to serving and terminating endpoints is decided per family,
// as kube-proxy's per-family proxiers each categorize their own family's
// endpoints: a family without a ready endpoint serves its clients with its
// terminating ones even while the other family has ready ones, and a
// family with a ready one ignores its terminating ones. Only a family
// left with no eligible endpoint at all is served by the other's, as a
// single-family Service is.
func TestFamilyFallbackToTerminatingIsPerFamily(t *testing.T) {
	v4r, v4t, v4x := addr("10.0.0.1:80"), addr("10.0.0.2:80"), addr("10.0.0.3:80")
	v6r, v6t := addr("[fd00::1]:80"), addr("[fd00::2]:80")
	c4, c6 := ip("10.1.0.1"), ip("fd01::1")
	ready := func(a netip.AddrPort) Endpoint { return Endpoint{Addr: a, Ready: true, Serving: true} }
	terminating := func(a netip.AddrPort) Endpoint { return Endpoint{Addr: a, Serving: true, Terminating: true} }
	gone := func(a netip.AddrPort) Endpoint { return Endpoint{Addr: a, Terminating: true} }
	tests := []struct {
		name      string
		eps       []Endpoint
		want4     []netip.AddrPort // what IPv4 clients are served by
		want6     []netip.AddrPort // what IPv6 clients are served by
		eligibleN int
	}{
		{"IPv4 terminating only, IPv6 ready", []Endpoint{terminating(v4t), ready(v6r), terminating(v6t)},
			[]netip.AddrPort{v4t}, []netip.AddrPort{v6r}, 2},
		{"IPv6 terminating only, IPv4 ready", []Endpoint{ready(v4r), terminating(v4t), terminating(v6t)},
			[]netip.AddrPort{v4r}, []netip.AddrPort{v6t}, 2},
		{"both ready: terminating ignored in each", []Endpoint{terminating(v4t), ready(v4r), terminating(v6t), ready(v6r)},
			[]netip.AddrPort{v4r}, []netip.AddrPort{v6r}, 2},
		{"both terminating only", []Endpoint{terminating(v4t), gone(v4x), terminating(v6t)},
			[]netip.AddrPort{v4t}, []netip.AddrPort{v6t}, 2},
		{"IPv4 has none eligible: IPv6 ready serve all", []Endpoint{gone(v4x), ready(v6r), terminating(v6t)},
			[]netip.AddrPort{v6r}, []netip.AddrPort{v6r}, 1},
		{"IPv4-mapped endpoint counts as IPv4", []Endpoint{terminating(addr("[::ffff:10.0.0.2]:80")), ready(v6r)},
			[]netip.AddrPort{addr("[::ffff:10.0.0.2]:80")}, []netip.AddrPort{v6r}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, _ := newTestBalancer(t)
			name := svcName("dual")
			lb.SetEndpoints(name, tt.eps)
			sp := lb.ServicePort(name)
			for _, c := range []struct {
				client netip.Addr
				want   []netip.AddrPort
			}{{c4, tt.want4}, {c6, tt.want6}} {
				var got []netip.AddrPort
				for range 2 * len(c.want) {
					if ep := mustNext(t, sp, c.client, false); !slices.Contains(got, ep) {
						got = append(got, ep)
					}
				}
				slices.SortFunc(got, netip.AddrPort.Compare)
				if !slices.Equal(got, c.want) {
					t.Errorf("client %v served by %v, want %v", c.client, got, c.want)
				}
			}
			if n := len(sp.Snapshot().Endpoints); n != tt.eligibleN {
				t.Errorf("%d eligible endpoints, want %d", n, tt.eligibleN)
			}
		})
	}
}

// A dual-stack Service's port whose endpoints are of one family serves only
// that family's clients: the other family's get ErrNoEndpoints, as from
// kube-proxy, whose per-family proxiers each hold only their family's
// EndpointSlices (an IPv6 client was served by the IPv4 endpoints, and on
// an IPv6-only node such a dial failed with "network is unreachable").
func TestFamiliesApartWithOneFamily(t *testing.T) {
	lb, _ := newTestBalancer(t)
	name := svcName("dual")
	lb.SetFamiliesApart(name, true)
	lb.SetEndpoints(name, []Endpoint{{Addr: addr("10.0.0.1:80"), Ready: true, Serving: true}})
	sp := lb.ServicePort(name)
	if got := mustNext(t, sp, ip("10.1.0.1"), false); got != addr("10.0.0.1:80") {
		t.Fatalf("IPv4 client got %v", got)
	}
	if got := mustNext(t, sp, ip("::ffff:10.1.0.2"), false); got != addr("10.0.0.1:80") {
		t.Fatalf("IPv4-mapped client got %v", got)
	}
	for _, reset := range []bool{false, true} {
		if got, err := sp.Next(ip("fd01::1"), reset); !errors.Is(err, ErrNoEndpoints) {
			t.Fatalf("IPv6 client (retry %v): %v, %v; want ErrNoEndpoints", reset, got, err)
		}
	}
	lb.SetAffinity(name, clientIPPolicy(time.Hour))
	if got, err := sp.Next(ip("fd01::1"), false); !errors.Is(err, ErrNoEndpoints) {
		t.Fatalf("IPv6 client with affinity: %v, %v; want ErrNoEndpoints", got, err)
	}
	lb.SetFamiliesApart(name, false) // the Service became single-stack
	if got := mustNext(t, sp, ip("fd01::1"), false); got != addr("10.0.0.1:80") {
		t.Fatalf("IPv6 client of a single-stack Service got %v", got)
	}
}

// A client pinned to an endpoint of the other family while the families
// mixed (a single-stack Service with endpoints of one family) gets one of
// its own family once they are apart: the Service became dual-stack and
// its other family's endpoints arrived. The pin was kept, refreshed by
// every use, for as long as the client came back.
func TestPinAcrossFamiliesDropped(t *testing.T) {
	lb, _ := newTestBalancer(t)
	name := svcName("dual")
	lb.SetAffinity(name, clientIPPolicy(time.Hour))
	lb.SetEndpoints(name, []Endpoint{{Addr: addr("10.0.0.1:80"), Ready: true, Serving: true}})
	sp := lb.ServicePort(name)
	c6 := ip("fd01::1")
	if got := mustNext(t, sp, c6, false); got != addr("10.0.0.1:80") {
		t.Fatalf("single-stack: IPv6 client got %v", got)
	}
	lb.SetFamiliesApart(name, true)
	lb.SetEndpoints(name, []Endpoint{
		{Addr: addr("10.0.0.1:80"), Ready: true, Serving: true},
		{Addr: addr("[fd00::1]:80"), Ready: true, Serving: true},
	})
	for range 3 {
		if got := mustNext(t, sp, c6, false); got != addr("[fd00::1]:80") {
			t.Fatalf("dual-stack: IPv6 client got %v, want its own family's endpoint", got)
		}
	}
}
