package proxier

import (
	"net/netip"
	"slices"

	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// The IP family names, as kube-proxy's (v1.IPFamily): its metrics' ip_family
// label values and its log lines' family.
const (
	ipv4Family = "IPv4"
	ipv6Family = "IPv6"
)

// ipFamilies is a set of IP families; 0 is none known (every one).
type ipFamilies uint8

const (
	familyIPv4 ipFamilies = 1 << iota
	familyIPv6
)

// familiesOf is the set of the families named (ipv4Family, ipv6Family).
func familiesOf(names []string) ipFamilies {
	var f ipFamilies
	for _, n := range names {
		switch n {
		case ipv4Family:
			f |= familyIPv4
		case ipv6Family:
			f |= familyIPv6
		}
	}
	return f
}

// takes reports whether an EndpointSlice of address type at gives
// endpoints to a Service of families f (0: every family).
func (f ipFamilies) takes(at discovery.AddressType) bool {
	switch {
	case f == 0:
		return true
	case at == discovery.AddressTypeIPv4:
		return f&familyIPv4 != 0
	case at == discovery.AddressTypeIPv6:
		return f&familyIPv6 != 0
	}
	return true
}

// served reports whether an EndpointSlice of address type at is one a
// node serving the families f has a kube-proxy proxier for (f 0: both).
// Unlike takes, a slice of neither family (FQDN, an unknown type) is not.
func (f ipFamilies) served(at discovery.AddressType) bool {
	return (at == discovery.AddressTypeIPv4 || at == discovery.AddressTypeIPv6) && f.takes(at)
}

// serviceFamilies is the IP families the port's Service is served in:
// those of its ClusterIPs (spec.clusterIPs), as kube-proxy's per-family
// proxiers each hold the Services with a ClusterIP of their family, else
// those of its other addresses, as for its NodePort (nodePortFamilies).
func (a *servicePortInfo) serviceFamilies() ipFamilies {
	var f ipFamilies
	v4, v6 := a.nodePortFamilies(a.portalFamilies())
	if v4 {
		f |= familyIPv4
	}
	if v6 {
		f |= familyIPv6
	}
	return f
}

// servedFamilies is the families the port's Service is served in on this
// node: serviceFamilies without the one this node has no portals for
// (unsupportedFamily), as kube-proxy runs no proxier of that family there.
// A dual-stack Service on a node without IPv6 netfilter (or with an IPv4
// --bind-address) is then an IPv4 Service: its IPv6 slices give it
// nothing, and its healthCheckNodePort counts only its IPv4 local pods,
// on whichever address the check arrives. Called with p.mu held or from
// the sync (opts do not change).
func (p *Proxier) servedFamilies(a *servicePortInfo) ipFamilies {
	f := a.serviceFamilies()
	switch p.unsupportedFamily() {
	case ipv4Family:
		if f != familyIPv4 {
			f &^= familyIPv4
		}
	case ipv6Family:
		if f != familyIPv6 {
			f &^= familyIPv6
		}
	}
	return f
}

// unsupportedFamily is the family that has no portal syncer while the
// other has one: on a node without its netfilter (iptables.Present: no
// ip6tables nat table, IPv6 disabled at boot) the proxy serves the other
// family only, as kube-proxy does. "" when both or neither have one
// (--iptables=false: sockets only, no family is short of anything).
func (p *Proxier) unsupportedFamily() string {
	switch v4, v6 := p.opts.IPv4Portals != nil, p.opts.IPv6Portals != nil; {
	case v4 && !v6:
		return ipv6Family
	case v6 && !v4:
		return ipv4Family
	}
	return ""
}

// portalFamilies reports the families the port's portals are in, as
// syncPortals splits them: those of its addresses, and IPv4 for a port
// without any (a NodePort's).
func (a *servicePortInfo) portalFamilies() (v4, v6 bool) {
	v6 = a.hasIPv6()
	for _, group := range [][]netip.Addr{a.clusterIPs, a.externalIPs, a.loadBalancerIPs} {
		for _, ip := range group {
			v4 = v4 || ip.Is4()
		}
	}
	return v4 || !v6, v6
}

// nodePortFamilies reports the families the port's NodePort is served in:
// those of its ClusterIPs, as kube-proxy's per-family proxiers, each of
// which serves the Services of its family (spec.clusterIPs): an IPv4-only
// Service with an IPv6 externalIP or LoadBalancer IP does not open its
// NodePort on the node's IPv6 addresses. A port without ClusterIPs (a
// NodePort Service always has one) takes the families of its other portals,
// hasV4 and hasV6, and IPv4 when it has none.
func (a *servicePortInfo) nodePortFamilies(hasV4, hasV6 bool) (v4, v6 bool) {
	for _, ip := range a.clusterIPs {
		v4, v6 = v4 || ip.Is4(), v6 || ip.Is6()
	}
	if !v4 && !v6 {
		v4, v6 = hasV4, hasV6
	}
	return v4 || !v6, v6
}

// hasPortalOutside reports whether the port has a portal in a family other
// than missing.
func (a *servicePortInfo) hasPortalOutside(missing string) bool {
	v4, v6 := a.portalFamilies()
	return missing == ipv6Family && v4 || missing == ipv4Family && v6
}

// withPortal leaves out the ports whose every portal is of the unsupported
// family: as kube-proxy, whose proxier of that family does not exist,
// such a port gets nothing, no proxy socket (no traffic could reach it),
// no balancer entry, no NodePort claim and no healthCheckNodePort. It held
// all of them, on a port of the node nothing was sent to. A dual-stack
// port keeps them and is served in the family that works. infos is
// returned as it is when nothing is left out, and always with both
// families or neither (--iptables=false: every port served on its socket).
// Called with p.mu held.
func (p *Proxier) withPortal(infos []*servicePortInfo) []*servicePortInfo {
	missing := p.unsupportedFamily()
	if missing == "" || !slices.ContainsFunc(infos, func(info *servicePortInfo) bool { return !info.hasPortalOutside(missing) }) {
		return infos
	}
	var out []*servicePortInfo
	for _, info := range infos {
		if info.hasPortalOutside(missing) {
			out = append(out, info)
		}
	}
	return out
}

// noteNoPortal logs a changed Service (infos nil: removed) whose every
// portal is of the unsupported family, once per Service: it is not served
// (withPortal), and its syncs are otherwise silent about it. A dual-stack
// Service is served in the family that works, without a word. Called with
// p.mu held.
func (p *Proxier) noteNoPortal(nn types.NamespacedName, infos []*servicePortInfo) {
	missing := p.unsupportedFamily()
	if missing == "" {
		return
	}
	none := len(infos) > 0
	for _, info := range infos {
		if info.hasPortalOutside(missing) {
			none = false
		}
	}
	switch {
	case !none:
		delete(p.noPortal, nn)
	case !p.noPortal[nn]:
		p.noPortal[nn] = true
		// A family goes without portals for one of two causes: the bind
		// address names one address (the command drops the other family's
		// syncer: sockets there cannot take its traffic), or the node's
		// netfilter lacks it.
		if b := p.opts.BindAddress; b.IsValid() && !b.IsUnspecified() && b.Unmap().Is4() != (missing == ipv4Family) {
			klog.InfoS("Service gets no portal and is not served: the bind address is of the other IP family (proxy sockets on one address cannot take this family's traffic)",
				"service", nn, "ipFamily", missing, "bindAddress", b)
			return
		}
		klog.InfoS("Service gets no portal and is not served: no iptables support for its IP family on this node", "service", nn, "ipFamily", missing)
	}
}
