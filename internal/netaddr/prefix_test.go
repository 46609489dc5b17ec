package netaddr

import (
	"net/netip"
	"testing"
)

func TestUnmapPrefix(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"10.1.2.3/8", "10.0.0.0/8", true},
		{"::ffff:10.0.0.0/104", "10.0.0.0/8", true},
		{"::ffff:10.1.2.3/128", "10.1.2.3/32", true},
		{"::ffff:0.0.0.0/96", "0.0.0.0/0", true},
		{"::ffff:0.0.0.0/80", "", false},
		{"fd00::1/64", "fd00::/64", true},
	} {
		got, ok := UnmapPrefix(netip.MustParsePrefix(tc.in))
		if ok != tc.ok || ok && got != netip.MustParsePrefix(tc.want) {
			t.Errorf("UnmapPrefix(%s) = %v, %v; want %s, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	if _, ok := UnmapPrefix(netip.Prefix{}); ok {
		t.Error("UnmapPrefix(invalid) reported ok")
	}
}

func TestIsLocal(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1": true, "::ffff:127.0.0.1": true, "192.0.2.77": false} {
		if got, err := IsLocal(netip.MustParseAddr(addr)); err != nil || got != want {
			t.Errorf("IsLocal(%s) = %v, %v; want %v", addr, got, err, want)
		}
	}
}
