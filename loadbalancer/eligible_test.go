package loadbalancer

import (
	"net/netip"
	"slices"
	"testing"
)

func TestEligibleEndpoints(t *testing.T) {
	a, b, c := backend(1), backend(2), backend(3)
	tests := []struct {
		name string
		eps  []Endpoint
		want []netip.AddrPort
	}{
		{name: "none", eps: nil, want: nil},
		{
			name: "ready only",
			eps: []Endpoint{
				{Addr: a, Ready: true, Serving: true},
				{Addr: b, Ready: false, Serving: false},
				{Addr: c, Ready: true, Serving: true},
			},
			want: []netip.AddrPort{a, c},
		},
		{
			name: "ready wins over serving+terminating",
			eps: []Endpoint{
				{Addr: a, Serving: true, Terminating: true},
				{Addr: b, Ready: true, Serving: true},
			},
			want: []netip.AddrPort{b},
		},
		{
			name: "no ready: fall back to serving and terminating",
			eps: []Endpoint{
				{Addr: a, Serving: true, Terminating: true},
				{Addr: b, Serving: false, Terminating: true},
				{Addr: c, Serving: true, Terminating: true},
			},
			want: []netip.AddrPort{a, c},
		},
		{
			name: "serving but not terminating is not a fallback",
			eps:  []Endpoint{{Addr: a, Serving: true}},
			want: nil,
		},
		{
			name: "duplicates kept once, first-seen order",
			eps: []Endpoint{
				{Addr: b, Ready: true}, {Addr: a, Ready: true}, {Addr: b, Ready: true},
			},
			want: []netip.AddrPort{b, a},
		},
		{
			name: "fallback decided per family: IPv4 terminating kept beside ready IPv6",
			eps: []Endpoint{
				{Addr: a, Serving: true, Terminating: true},
				{Addr: addr("[fd00::1]:80"), Ready: true, Serving: true},
				{Addr: addr("[fd00::2]:80"), Serving: true, Terminating: true},
			},
			want: []netip.AddrPort{a, addr("[fd00::1]:80")},
		},
		{
			name: "invalid address skipped",
			eps:  []Endpoint{{Ready: true}, {Addr: a, Ready: true}},
			want: []netip.AddrPort{a},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := eligibleEndpoints(tt.eps); !slices.Equal(got, tt.want) {
				t.Errorf("eligibleEndpoints = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestAddrSetEqualTo(t *testing.T) {
	a, b, c := backend(1), backend(2), backend(3)
	tests := []struct {
		name  string
		set   []netip.AddrPort
		other []netip.AddrPort
		want  bool
	}{
		{name: "both empty", want: true},
		{name: "same order", set: []netip.AddrPort{a, b}, other: []netip.AddrPort{a, b}, want: true},
		{name: "reordered", set: []netip.AddrPort{a, b, c}, other: []netip.AddrPort{c, a, b}, want: true},
		{name: "one more", set: []netip.AddrPort{a, b}, other: []netip.AddrPort{a, b, c}, want: false},
		{name: "one replaced", set: []netip.AddrPort{a, b}, other: []netip.AddrPort{a, c}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := newAddrSet(tt.set).equalTo(tt.other); got != tt.want {
				t.Errorf("equalTo = %v, want %v", got, tt.want)
			}
		})
	}
}
