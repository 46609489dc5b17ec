// Package netaddr holds the address rules that more than one package must
// read alike: a --nodeport-addresses CIDR (the rule renderer and the
// healthCheckNodePort servers) and whether an address is this host's (the
// NodePort and externalIP claims, the --node-ip check).
package netaddr

import (
	"net"
	"net/netip"
)

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

// IsLocal reports whether ip is an address of one of this host's
// interfaces; err when they cannot be listed.
func IsLocal(ip netip.Addr) (bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false, err
	}
	ip = ip.Unmap()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if local, ok := netip.AddrFromSlice(n.IP); ok && local.Unmap() == ip {
				return true, nil
			}
		}
	}
	return false, nil
}
