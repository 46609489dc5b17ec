// Package netaddr holds the address rules that more than one package must
// read alike: a --nodeport-addresses CIDR (the rule renderer and the
// healthCheckNodePort servers) and whether an address is this host's (the
// NodePort and externalIP claims, the --node-ip check).
package netaddr

import (
	"net"
	"net/netip"
	"slices"
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
	addrs, err := LocalAddrs()
	return slices.Contains(addrs, ip.Unmap()), err
}

// LocalAddrs are the addresses of this host's interfaces, unmapped; err
// when they cannot be listed.
func LocalAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
