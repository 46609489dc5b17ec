package loadbalancer

import (
	"net/netip"
	"testing"
	"time"
)

// A dual-stack service port keeps the families apart, as kube-proxy's
// per-family proxiers do: an IPv4 client is served by IPv4 endpoints only
// and an IPv6 client by IPv6 ones, each in fair round robin however their
// picks interleave. One family alone serves every client, as before.
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
