package proxier

import (
	"errors"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/netaddr"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// errOwnPortal: the endpoint picked is one of this proxy's own portals (a
// Service's ClusterIP, external or LB IP and port, or a NodePort of this
// node), which its rules send back to a proxy socket.
var errOwnPortal = errors.New("the endpoint is one of this proxy's own portals (a Service address or NodePort of this node), which would send the connection back to the proxy: a loop")

// ownPortals are the destinations the proxy's own rules capture: a dial
// from the node to one of them (OUTPUT's portals) comes back to a proxy
// socket as a new client. An endpoint there (an EndpointSlice naming a
// Service's own ClusterIP, or another's that names the first: anyone who
// may write EndpointSlices, or a selectorless Service pointed at another
// by mistake) made each client a chain without end: one UDP datagram a
// new session per hop for ever (a core, and a conntrack entry per hop
// until the table was full), one TCP connect two descriptors per hop until
// the proxy's were spent and every Service refused its clients. The
// kernel's DNAT, as kube-proxy's iptables mode does it, applies once per
// flow: such an endpoint is sent on out of the node there, not looped.
// Read on every dial (one atomic load, one map look-up); replaced at each
// sync that writes rules.
type ownPortals struct {
	set atomic.Pointer[portalSet]
	// keys are the portals set was built from, in the sync's order (the
	// sync's alone).
	keys []ownPortal
	// local is the node's addresses as last listed, for the NodePorts.
	local atomic.Pointer[localAddrs]
}

// localAddrs are the node's addresses as listed at a time (mono.Now). A
// listing (net.InterfaceAddrs, a netlink dump) cost every dial of an
// endpoint on a NodePort's number 24 µs and 44 allocations (5 addresses;
// more with each pod's veth): every connection of a Service whose
// targetPort is its nodePort.
type localAddrs struct {
	at    int64
	addrs []netip.Addr
}

// localAddrsFor is how long a listing serves: an address the node just
// gained is taken for a NodePort portal at most this late.
const localAddrsFor = time.Second

type portalSet struct {
	// ips holds the IP portals (proto, address, service port); nodePorts
	// the NodePorts (proto, port), which capture any local address.
	ips       map[ownPortal]struct{}
	nodePorts map[ownPortal]struct{}
}

type ownPortal struct {
	proto iptables.Protocol
	addr  netip.AddrPort
}

// update takes the portals a sync wrote (both families'). The set is
// built again only when they changed: built at every sync, 10,000
// Services' set cost an incremental sync 1 MB more (BenchmarkServiceChange10k).
// Only the sync calls it.
func (o *ownPortals) update(families ...[]iptables.Portal) {
	n, same := 0, true
	for _, portals := range families {
		for _, p := range portals {
			if k, ok := ownPortalOf(p); ok {
				same = same && n < len(o.keys) && o.keys[n] == k
				n++
			}
		}
	}
	if same && n == len(o.keys) && o.set.Load() != nil {
		return
	}
	keys := make([]ownPortal, 0, n)
	s := &portalSet{ips: make(map[ownPortal]struct{}, n), nodePorts: map[ownPortal]struct{}{}}
	for _, portals := range families {
		for _, p := range portals {
			k, ok := ownPortalOf(p)
			if !ok {
				continue
			}
			keys = append(keys, k)
			if p.NodePort {
				s.nodePorts[k] = struct{}{}
			} else {
				s.ips[k] = struct{}{}
			}
		}
	}
	o.keys = keys
	o.set.Store(s)
}

// ownPortalOf is the destination portal p captures (a NodePort's with no
// address); false for a rule that captures none.
func ownPortalOf(p iptables.Portal) (ownPortal, bool) {
	switch {
	case p.GuardOnly || p.HealthCheck || p.Port < 1 || p.Port > 65535:
		return ownPortal{}, false
	case p.NodePort:
		return ownPortal{p.Protocol, netip.AddrPortFrom(netip.Addr{}, uint16(p.Port))}, true
	}
	return ownPortal{p.Protocol, netip.AddrPortFrom(p.IP.Unmap(), uint16(p.Port))}, true
}

// captures reports whether the proxy's rules would send a dial from the
// node to ep back to a proxy socket. A NodePort's number at an address
// that is not the node's (a pod listening on that port) is no portal; the
// node's addresses are looked at only for an endpoint on a NodePort's
// number.
func (o *ownPortals) captures(proto iptables.Protocol, ep netip.AddrPort) bool {
	if o == nil {
		return false
	}
	s := o.set.Load()
	if s == nil {
		return false
	}
	ep = netip.AddrPortFrom(ep.Addr().Unmap(), ep.Port())
	if _, ok := s.ips[ownPortal{proto, ep}]; ok {
		return true
	}
	if len(s.nodePorts) == 0 {
		return false
	}
	if _, ok := s.nodePorts[ownPortal{proto, netip.AddrPortFrom(netip.Addr{}, ep.Port())}]; !ok {
		return false
	}
	return ep.Addr().IsLoopback() || o.isLocal(ep.Addr())
}

// isLocal reports whether ip (unmapped) is one of the node's addresses, as
// listed at most localAddrsFor ago.
func (o *ownPortals) isLocal(ip netip.Addr) bool {
	now := mono.Now()
	l := o.local.Load()
	if l == nil || now-l.at >= int64(localAddrsFor) {
		l = &localAddrs{at: now, addrs: interfaceAddrs()}
		o.local.Store(l)
	}
	return slices.Contains(l.addrs, ip)
}

// interfaceAddrs are the node's addresses (none when they cannot be
// listed).
func interfaceAddrs() []netip.Addr {
	addrs, _ := netaddr.LocalAddrs()
	return addrs
}
