package iptables

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/netaddr"
)

// Family is the IP family one set of rules (and one Runner) serves:
// iptables for IPv4, ip6tables for IPv6. Dual-stack Services get a portal in
// each family, programmed by two independent Rules.
type Family int

const (
	IPv4 Family = iota
	IPv6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return fmt.Sprintf("Family(%d)", int(f))
}

// hostBits is the prefix length of a single address in this family.
func (f Family) hostBits() int {
	if f == IPv6 {
		return 128
	}
	return 32
}

// owns reports whether addr belongs to this family (4-in-6 counts as IPv4).
func (f Family) owns(addr netip.Addr) bool {
	if !addr.IsValid() {
		return false
	}
	return addr.Unmap().Is4() == (f == IPv4)
}

// Config says where the proxy sockets of one family listen and which
// addresses NodePorts answer on.
type Config struct {
	Family Family
	// BindAddress is where proxy sockets listen. Unspecified (0.0.0.0 or ::)
	// or zero: traffic is DNATed to NodeIP:proxyPort (see NodeIP); otherwise
	// it is DNATed to BindAddress:proxyPort from both PREROUTING and OUTPUT.
	BindAddress netip.Addr
	// NodeIP is the DNAT target of every portal when BindAddress is
	// unspecified: for traffic the node itself sends (OUTPUT) and, unless
	// PreroutingRedirect, for traffic from pods and other hosts
	// (PREROUTING). When it is zero, both fall back to REDIRECT: OUTPUT to
	// the loopback address (no route_localnet needed, such packets never
	// leave the node), PREROUTING to the incoming interface's address. An
	// IPv6 link-local NodeIP is local on its own link only: both REDIRECT
	// then too (see LinkScoped).
	NodeIP netip.Addr
	// PreroutingRedirect keeps the legacy REDIRECT in PREROUTING with an
	// unspecified BindAddress. REDIRECT sends a packet to the primary
	// address of the interface it came in on, and drops it when that
	// interface has none: the host side of a pod's veth on Calico or the
	// AWS VPC CNI (proxy ARP, a /32 route, no address). DNAT to the node IP
	// works whatever the incoming interface.
	PreroutingRedirect bool
	// NodePortAddresses limits NodePorts to these CIDRs (those of other
	// families are ignored). Empty, or none of this family, means every local
	// address (addrtype LOCAL), as kube-proxy does.
	NodePortAddresses []netip.Prefix
	// ClusterCIDRs are the pods' addresses (kube-proxy's --cluster-cidr,
	// detect-local-mode ClusterCIDR): traffic from them to an external
	// address of an externalTrafficPolicy: Local Service is cluster traffic
	// (Portal.ClusterProxyPort). Those of the other family are ignored.
	ClusterCIDRs []netip.Prefix
}

// bindsAll reports whether proxy sockets listen on every address.
func (c Config) bindsAll() bool {
	return !c.BindAddress.IsValid() || c.BindAddress.IsUnspecified()
}

// nodePortCIDRs returns the --nodeport-addresses of this family, masked and
// in a stable order; nil means all local addresses.
func (c Config) nodePortCIDRs() []netip.Prefix { return c.familyCIDRs(c.NodePortAddresses) }

// clusterCIDRs returns the --cluster-cidr of this family, masked and sorted.
func (c Config) clusterCIDRs() []netip.Prefix { return c.familyCIDRs(c.ClusterCIDRs) }

func (c Config) familyCIDRs(cidrs []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	seen := map[netip.Prefix]bool{}
	for _, p := range cidrs {
		p, ok := c.familyCIDR(p)
		if !ok {
			continue
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	slices.SortFunc(out, comparePrefixes)
	return out
}

// familyCIDR is p masked and unmapped, false when it is not of this family.
func (c Config) familyCIDR(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() || !c.Family.owns(p.Addr()) {
		return p, false
	}
	return netaddr.UnmapPrefix(p)
}

// NodePortCaptures reports whether this family's NodePort rules take a
// connection to ip, given that ip is one of the node's own addresses (the
// rules' addrtype LOCAL): as nodePortDestinations renders them, every such
// address but IPv6's ::1, or with --nodeport-addresses of this family
// those inside its CIDRs (::1/128 takes none). The proxy's own-portal
// check asks it for an endpoint on a NodePort's number; it allocates
// nothing, being on the dial's path.
func (c Config) NodePortCaptures(ip netip.Addr) bool {
	if !c.Family.owns(ip) {
		return false
	}
	ip = ip.Unmap()
	restricted := false
	for _, p := range c.NodePortAddresses {
		p, ok := c.familyCIDR(p)
		if !ok {
			continue
		}
		restricted = true
		if p != ipv6Loopback && p.Contains(ip) {
			return true
		}
	}
	return !restricted && !(c.Family == IPv6 && ip.IsLoopback())
}

// ipv6Loopback is ::1/128, the CIDR of ipv6LoopbackDst.
var ipv6Loopback = netip.PrefixFrom(netip.IPv6Loopback(), 128)

// validate reports configurations that would render rules of the wrong family.
func (c Config) validate() error {
	if c.Family != IPv4 && c.Family != IPv6 {
		return fmt.Errorf("unknown IP family %v", c.Family)
	}
	if !c.bindsAll() && !c.Family.owns(c.BindAddress) {
		return fmt.Errorf("%v rules: bind address %v is of the other family", c.Family, c.BindAddress)
	}
	return nil
}
