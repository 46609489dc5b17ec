// Package netaddr holds the address rules the rule renderer and the
// healthCheckNodePort servers must read alike.
package netaddr

import "net/netip"

// UnmapPrefix returns p with an IPv4-mapped prefix (::ffff:10.0.0.0/104)
// as the IPv4 prefix it maps (10.0.0.0/8), masked. It reports false for an
// invalid prefix and for a mapped one whose mask is shorter than the mapped
// prefix (/96): that covers more than IPv4, and is left out.
func UnmapPrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return p, false
	}
	if p.Addr().Is4In6() {
		if p.Bits() < 96 {
			return p, false
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked(), true
}
