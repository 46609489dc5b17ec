package proxier

import (
	"errors"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/netaddr"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
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
// Read on every dial (one atomic load, one map look-up); each family's
// replaced once the sync wrote its rules.
type ownPortals struct {
	// families are the IPv4 and the IPv6 rules' portals: an endpoint is
	// captured by its own family's rules alone.
	families [2]familyPortals
	// local is the node's addresses as last listed, for the NodePorts.
	local atomic.Pointer[localAddrs]
}

// familyPortals are the portals one family's rules hold.
type familyPortals struct {
	set atomic.Pointer[portalSet]
	// keys are the portals set was built from, in the sync's order (the
	// sync's alone).
	keys []ownPortal
	// nodePorts says which of the node's addresses the family's NodePort
	// rules take (--nodeport-addresses); nil: the rules' default, every
	// local address but IPv6's ::1. Set before the first sync.
	nodePorts NodePortCapturer
}

// familyIndex is the index in ownPortals.families of ip's family.
func familyIndex(ip netip.Addr) int {
	if ip.Unmap().Is4() {
		return 0
	}
	return 1
}

// defaultNodePorts are the NodePort rules of each family without
// --nodeport-addresses.
var defaultNodePorts = [2]NodePortCapturer{iptables.Config{Family: iptables.IPv4}, iptables.Config{Family: iptables.IPv6}}

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
	// the NodePorts (proto, port), which capture the node's addresses the
	// family's NodePort rules take.
	ips       map[ownPortal]struct{}
	nodePorts map[ownPortal]struct{}
}

type ownPortal struct {
	proto iptables.Protocol
	addr  netip.AddrPort
	// nodePort: a NodePort's key (nodePortKey), its address the
	// family's unspecified one.
	nodePort bool
}

// written takes the portals a sync wrote to one family's rules (f:
// familyIndex) once the write is done: the set follows the kernel. When
// the write failed, the kernel holds the last written portals, these, or
// part of each (the tables are restored one by one, a large nat table in
// two parts), so the set holds both until a write goes through: a portal
// the failed write was to remove still loops a dial to it. Before, the
// set took the sync's portals before the write, so a failed one left
// removed portals in the kernel unguarded, and refused endpoints at new
// ones no rule captured yet. While a write runs, a portal it adds is not
// refused yet: a loop through it lasts until the set takes it, a few
// milliseconds, as each hop then refuses the next.
//
// The set is built again only when the portals changed: built at every
// sync, 10,000 Services' set cost an incremental sync 1 MB more
// (BenchmarkServiceChange10k). Only the sync calls it.
func (o *ownPortals) written(f int, portals []iptables.Portal, failed bool) {
	fp := &o.families[f]
	n, same := 0, true
	for _, p := range portals {
		if k, ok := ownPortalOf(f, p); ok {
			same = same && n < len(fp.keys) && fp.keys[n] == k
			n++
		}
	}
	if same && n == len(fp.keys) && fp.set.Load() != nil {
		return
	}
	var keys []ownPortal
	if failed {
		if keys = grownBy(fp.keys, f, portals); keys == nil && fp.set.Load() != nil {
			return // the set holds them all already
		}
	} else {
		keys = make([]ownPortal, 0, n)
		for _, p := range portals {
			if k, ok := ownPortalOf(f, p); ok {
				keys = append(keys, k)
			}
		}
	}
	s := &portalSet{ips: make(map[ownPortal]struct{}, len(keys)), nodePorts: map[ownPortal]struct{}{}}
	for _, k := range keys {
		if k.nodePort {
			s.nodePorts[k] = struct{}{}
		} else {
			s.ips[k] = struct{}{}
		}
	}
	fp.keys = keys
	fp.set.Store(s)
}

// grownBy is have with the portals of portals it lacks appended, nil when
// it lacks none.
func grownBy(have []ownPortal, f int, portals []iptables.Portal) []ownPortal {
	in := make(map[ownPortal]bool, len(have))
	for _, k := range have {
		in[k] = true
	}
	var grown []ownPortal
	for _, p := range portals {
		if k, ok := ownPortalOf(f, p); ok && !in[k] {
			in[k] = true
			grown = append(grown, k)
		}
	}
	if grown == nil {
		return nil
	}
	return append(slices.Clone(have), grown...)
}

// ownPortalOf is the destination portal p of family f captures (a
// NodePort's with the family's unspecified address); false for a rule
// that captures none.
func ownPortalOf(f int, p iptables.Portal) (ownPortal, bool) {
	switch {
	case p.GuardOnly || p.HealthCheck || p.Port < 1 || p.Port > 65535:
		return ownPortal{}, false
	case p.NodePort:
		return nodePortKey(f, p.Protocol, uint16(p.Port)), true
	}
	return ownPortal{proto: p.Protocol, addr: netip.AddrPortFrom(p.IP.Unmap(), uint16(p.Port))}, true
}

// nodePortKey is the set's key of family f's NodePort port.
func nodePortKey(f int, proto iptables.Protocol, port uint16) ownPortal {
	unspecified := netip.IPv4Unspecified()
	if f == 1 {
		unspecified = netip.IPv6Unspecified()
	}
	return ownPortal{proto, netip.AddrPortFrom(unspecified, port), true}
}

// captures reports whether the proxy's rules would send a dial from the
// node to ep back to a proxy socket: a portal of ep's family, or one of
// its NodePorts at one of the node's addresses that the NodePort rules
// take (a NodePort's number at an address that is not the node's is a pod
// listening on that port; [::1] and, with --nodeport-addresses, addresses
// outside them are not NodePorts). The node's addresses are looked at
// only for an endpoint on a NodePort's number.
func (o *ownPortals) captures(proto iptables.Protocol, ep netip.AddrPort) bool {
	if o == nil {
		return false
	}
	ip := ep.Addr().Unmap()
	f := familyIndex(ip)
	fp := &o.families[f]
	s := fp.set.Load()
	if s == nil {
		return false
	}
	if _, ok := s.ips[ownPortal{proto: proto, addr: netip.AddrPortFrom(ip, ep.Port())}]; ok {
		return true
	}
	if len(s.nodePorts) == 0 {
		return false
	}
	if _, ok := s.nodePorts[nodePortKey(f, proto, ep.Port())]; !ok {
		return false
	}
	rules := fp.nodePorts
	if rules == nil {
		rules = defaultNodePorts[f]
	}
	return rules.NodePortCaptures(ip) && (ip.IsLoopback() || o.isLocal(ip))
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

// pass is ep, or when ep is one of the proxy's own portals (proto's) the
// balancer's retry past it, as past an endpoint whose dial failed (failed
// gains it): such an endpoint is never dialled (its dial would come back
// to the proxy, errOwnPortal), but the Service's other endpoints still
// serve the client, whose round-robin turn or affinity fell on it. It
// takes no dial attempt (UDP spent one on each, re-picking past the last
// alone: 4 such endpoints beside a live one dropped a client whose turn
// fell on the first); errOwnPortal when no other endpoint is left, or
// after maxDialAttempts such endpoints. label names the service port.
func (o *ownPortals) pass(proto iptables.Protocol, sp *loadbalancer.ServicePort, label string, client netip.Addr, ep netip.AddrPort, failed []netip.AddrPort) (netip.AddrPort, []netip.AddrPort, error) {
	for range maxDialAttempts {
		if !o.captures(proto, ep) {
			return ep, failed, nil
		}
		if slices.Contains(failed, ep) {
			break // the retry found every endpoint tried
		}
		failed = append(failed, ep)
		klog.V(3).InfoS("Endpoint passed over: it is one of this proxy's own portals", "servicePort", label, "endpoint", ep)
		var err error
		if ep, err = sp.Retry(client, failed); err != nil {
			return netip.AddrPort{}, failed, err
		}
	}
	return netip.AddrPort{}, failed, errOwnPortal
}
