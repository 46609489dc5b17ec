package config

import (
	"net/netip"
	"strings"

	netutils "k8s.io/utils/net"
)

// ParseObjectIP reads an IP address of an object from the cluster (a
// Service's clusterIPs, externalIPs and ingress IPs, an endpoint's address,
// a Node's addresses) as kube-proxy does, with k8s.io/utils/net's
// ParseIPSloppy: an IPv4 part with leading zeros ("010.0.0.1") is read as
// decimal (10.0.0.1). API servers stored such addresses before their IP
// validation tightened (strict IP validation, KEP-4858), and keep them on
// objects created then; netip.ParseAddr refuses them, which left such a
// Service or endpoint out without a word. An IPv4-mapped address is
// returned unmapped, as the proxier serves it; a zone is refused.
func ParseObjectIP(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Addr{}, false
		}
		return a.Unmap(), true
	}
	a, ok := netip.AddrFromSlice(netutils.ParseIPSloppy(s))
	return a.Unmap(), ok
}

// ParseObjectPrefix reads a CIDR of an object from the cluster (a
// Service's loadBalancerSourceRanges) as kube-proxy does: spaces around it
// are trimmed, an IPv4 part with leading zeros is read as decimal
// (ParseCIDRSloppy), and the result is masked.
func ParseObjectPrefix(s string) (netip.Prefix, bool) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), true
	}
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a, ones).Masked(), true
}
