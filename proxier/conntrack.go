package proxier

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// ConntrackCleaner removes conntrack entries that would keep a client away
// from a proxy socket that is new or has new destinations, and the UDP
// entries to destinations no socket has any more (a socket that closed, a
// service IP or NodePort removed). A flow's entry keeps its first NAT
// decision:
//   - UDP: for as long as the client keeps sending, so when a service's
//     proxy port changes (a restart, a re-created Service) a client that
//     reuses its source port, as DNS resolvers do, would keep hitting the
//     old, closed port forever. kube-proxy clears entries for the same reason.
//   - TCP: a SYN sent to a service IP before its portal existed leaves an
//     un-NATed SYN_SENT entry for 120 s, so the client's retransmissions, and
//     a new connection from the same source port, bypass the portal. And a
//     connection the last proxy reset at its exit leaves an entry in CLOSE
//     NATed to its port for 10 s: the kernel sends a new SYN from the same
//     source port (ephemeral ports are reused under load) to that port
//     again rather than through the portal, refused when the new proxy
//     listens elsewhere (an overlap, a taken port, a port range changed).
//
// Each clearing walks the whole conntrack table (the kernel walks every
// bucket of the hash shared by all namespaces: 10 ms on an idle 2-CPU
// machine, about 0.3 s in make bench's node after its TCP runs), so a sync
// clears the entries of all its new sockets together: one pass per
// destination made the first sync of 10,000 Services take 104 s
// (BenchmarkKernelSync10k/first). The entries of a few destinations are
// dumped with a filter each, which spares Go the parsing of all the
// others; those of many in one dump of the whole table per address family
// (clearFamily).
type ConntrackCleaner interface {
	// ClearStale deletes the entries that any of flows names.
	ClearStale(flows []StaleFlows) error
}

// StaleFlows names the conntrack entries to one service destination that
// would keep its clients away from the destination's proxy socket.
type StaleFlows struct {
	Protocol v1.Protocol
	// Dst is the original destination; an invalid address stands for that
	// port on every address (NodePorts), an unspecified one (0.0.0.0, ::)
	// for that port on every address of its family.
	Dst netip.AddrPort
	// Live are the proxy ports serving Dst: entries a portal NATed to one
	// of them are not stale. Those flows already reach a socket of ours,
	// and an entry deleted under a flow in full swing turns the replies
	// in flight into un-NATed datagrams the client's connected socket
	// drops. Every UDP entry to Dst NATed elsewhere, or not NATed, is
	// stale. TCP: un-NATed entries are, and those NATed elsewhere only
	// once reset (CLOSE): the others are connections, live or ending with
	// their socket, possibly another proxy's beside this one (which
	// rewrites the same portals, but whose connections go on meanwhile).
	Live []int
	// ResetOnly: only those reset entries NATed elsewhere are stale, the
	// un-NATed ones are not (a TCP NodePort: its destination is any
	// address, and the node's own connections to that port on other
	// hosts are un-NATed).
	ResetOnly bool
}

// tcpReset is the kernel's TCP conntrack state after a reset.
const tcpReset = nl.TCP_CONNTRACK_CLOSE

// NetlinkConntrack talks to the kernel's conntrack table over netlink.
type NetlinkConntrack struct{}

func (NetlinkConntrack) ClearStale(flows []StaleFlows) error {
	return clearStale(kernelConntrack{}, flows, &kernelIgnoresFilter)
}

// clearStale deletes from t, in each family, the entries that any of flows
// names (clearFamily).
func clearStale(t conntrackTable, flows []StaleFlows, ignoresFilter *atomic.Bool) error {
	var v4, v6 staleSet
	for _, f := range flows {
		if !f.Dst.Addr().Is6() {
			v4.add(f)
		}
		if !f.Dst.Addr().Is4() {
			v6.add(f)
		}
	}
	for _, pass := range []struct {
		family netlink.InetFamily
		set    staleSet
	}{{unix.AF_INET, v4}, {unix.AF_INET6, v6}} {
		if len(pass.set) == 0 {
			continue
		}
		if err := clearFamily(t, pass.family, pass.set, ignoresFilter); err != nil {
			return fmt.Errorf("conntrack delete stale entries (family %d, %d destinations): %w", pass.family, len(pass.set), err)
		}
	}
	return nil
}

// staleSet matches the stale entries of many destinations with one lookup
// per entry: a dump of the whole table serves every Service.
type staleSet map[staleKey]staleDst

// staleDst is what makes an entry to one destination stale: NATed to a
// port other than live, and, with resetOnly, reset (StaleFlows).
type staleDst struct {
	live      []int
	resetOnly bool
}

// staleKey is an entry's protocol and original destination; an invalid
// address for destinations on every address.
type staleKey struct {
	protocol uint8
	dst      netip.AddrPort
}

func (s *staleSet) add(f StaleFlows) {
	if *s == nil {
		*s = staleSet{}
	}
	proto := uint8(unix.IPPROTO_UDP)
	switch f.Protocol {
	case v1.ProtocolTCP:
		proto = unix.IPPROTO_TCP
	case v1.ProtocolUDP:
	default:
		return
	}
	live := f.Live
	if live == nil {
		live = []int{} // present, and no port is live
	}
	addr := f.Dst.Addr().Unmap()
	if addr.IsUnspecified() {
		addr = netip.Addr{} // the pass is of its family already
	}
	key := staleKey{proto, netip.AddrPortFrom(addr, f.Dst.Port())}
	resetOnly := f.ResetOnly
	if had, ok := (*s)[key]; ok {
		resetOnly = resetOnly && had.resetOnly
	}
	(*s)[key] = staleDst{live: live, resetOnly: resetOnly}
}

func (s staleSet) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	orig, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	if !ok {
		return false
	}
	orig = orig.Unmap()
	key := staleKey{flow.Forward.Protocol, netip.AddrPortFrom(orig, flow.Forward.DstPort)}
	d, ok := s[key]
	if !ok {
		// A destination on every address (a NodePort) is looked up only
		// when the entry's own address names no service destination.
		key.dst = netip.AddrPortFrom(netip.Addr{}, flow.Forward.DstPort)
		if d, ok = s[key]; !ok {
			return false
		}
	}
	replySrc, ok := netip.AddrFromSlice(flow.Reverse.SrcIP)
	if !ok {
		return false
	}
	if replySrc.Unmap() == orig && flow.Reverse.SrcPort == flow.Forward.DstPort {
		return !d.resetOnly // no NAT rewrote it: tracked before the portal existed
	}
	if key.protocol == unix.IPPROTO_TCP {
		if tcp, ok := flow.ProtoInfo.(*netlink.ProtoInfoTCP); !ok || tcp.State != tcpReset {
			return false
		}
	}
	return !slices.Contains(d.live, int(flow.Reverse.SrcPort))
}

// staleFlowsToClear remembers a service port whose proxy socket is new, or
// whose rules changed, so its stale conntrack entries are cleared once a
// portal sync has written the rules, each family's once its own are in:
// before that new flows would meet the old rules, and a failed sync must not
// forget the port (it is kept, for the family whose write failed, until a
// sync writes that family's rules).
func (p *Proxier) staleFlowsToClear(name loadbalancer.ServicePortName) {
	if p.opts.Conntrack == nil {
		return
	}
	if p.pendingConntrack == nil {
		p.pendingConntrack = map[loadbalancer.ServicePortName]ipFamilies{}
	}
	p.pendingConntrack[name] = bothFamilies
}

// bothFamilies is the IPv4 and IPv6 families together.
const bothFamilies = familyIPv4 | familyIPv6

// dstFamilies is the families of a stale-flow destination: its address's,
// or both for an invalid address (a port on every address).
func dstFamilies(dst netip.AddrPort) ipFamilies {
	switch a := dst.Addr().Unmap(); {
	case !a.IsValid():
		return bothFamilies
	case a.Is4():
		return familyIPv4
	}
	return familyIPv6
}

// inFamilies is f restricted to the families fams: ok false when it has
// none of them. A destination on every address (invalid) is narrowed to
// every address of the one family given (0.0.0.0 or ::).
func (f StaleFlows) inFamilies(fams ipFamilies) (StaleFlows, bool) {
	switch dst, has := f.Dst, dstFamilies(f.Dst)&fams; {
	case has == 0:
		return f, false
	case dst.Addr().IsValid() || has == bothFamilies:
	case has == familyIPv4:
		f.Dst = netip.AddrPortFrom(netip.IPv4Unspecified(), dst.Port())
	default:
		f.Dst = netip.AddrPortFrom(netip.IPv6Unspecified(), dst.Port())
	}
	return f, true
}

// closedFlowsToClear remembers the destinations of a UDP service port whose
// socket closes for good (its Service deleted, the port removed, or its
// protocol changed), so that their entries are cleared once a portal sync
// has removed its rules, as kube-proxy clears those of deleted UDP
// Services. Each datagram of a client that keeps its source port (a
// resolver, a syslog sender) refreshes an entry NATed to the closed proxy
// port: its datagrams kept going to a dead port, or to whichever service
// port is given that port next, for as long as it kept sending. TCP
// entries are left alone: those that passed a portal are connections,
// which outlive their listening socket.
func (p *Proxier) closedFlowsToClear(ap *activePort) {
	if p.opts.Conntrack == nil || ap.info.name.Protocol != v1.ProtocolUDP {
		return
	}
	udpDestinations(ap.info, func(dst netip.AddrPort) { p.closedUDP[dst] = dstFamilies(dst) })
}

// removedFlowsToClear remembers the destinations a UDP service port that
// stays open no longer has (an external IP, LB ingress IP or NodePort
// removed from its Service, a ClusterIP changed, an address family
// dropped), for the same clearing as a closed port's, as kube-proxy clears
// the UDP entries of removed service IPs and node ports: a client that
// keeps its source port kept refreshing an entry NATed to the port's proxy
// socket through a portal that no longer exists, and so kept being served
// at an address the Service had given up (or never reached whichever
// socket serves that address next). Called with the port's old and new
// info before either socket change of the sync.
func (p *Proxier) removedFlowsToClear(old, info *servicePortInfo) {
	if p.opts.Conntrack == nil || info.name.Protocol != v1.ProtocolUDP || old.sameRules(info) {
		return
	}
	kept := map[netip.AddrPort]bool{}
	udpDestinations(info, func(dst netip.AddrPort) { kept[dst] = true })
	udpDestinations(old, func(dst netip.AddrPort) {
		if kept[dst] {
			return
		}
		p.closedUDP[dst] = dstFamilies(dst)
	})
}

// udpDestinations calls fn with every original destination of info's
// portals: each service IP with the port, and the NodePort on every
// address (an invalid address), as staleFlowsOf names UDP ones.
func udpDestinations(info *servicePortInfo, fn func(dst netip.AddrPort)) {
	for _, group := range [][]netip.Addr{info.clusterIPs, info.externalIPs, info.loadBalancerIPs} {
		for _, ip := range group {
			fn(netip.AddrPortFrom(ip, uint16(info.port)))
		}
	}
	if info.nodePort != 0 {
		fn(netip.AddrPortFrom(netip.Addr{}, uint16(info.nodePort)))
	}
}

// clearStaleFlows clears, in the families fams, the entries of every
// pending service port that is still served and of the destinations UDP
// ports closed or lost, in one clearing, then forgets them in
// those families. Called after a sync that wrote the rules of fams (every
// family when it wrote them all): as kube-proxy's per-family proxiers each
// clear their own, a family whose rules keep failing (ip6tables-restore)
// no longer holds back the other's clearing, whose clients that keep their
// source port stayed on dead proxy ports meanwhile; its own entries wait
// for its rules.
func (p *Proxier) clearStaleFlows(fams ipFamilies) {
	if len(p.pendingConntrack) == 0 && len(p.closedUDP) == 0 || fams == 0 {
		return
	}
	var flows []StaleFlows
	for name, pending := range p.pendingConntrack {
		moves := p.policyMoved[name]
		if ap := p.active[name]; ap != nil && pending&fams != 0 {
			clearing := pending & fams
			if clearing == bothFamilies && moves[0] != moves[1] {
				// The families' rules moved from different ones (the
				// policy changed again while one family's stayed
				// pending): each is judged against its own.
				for i, fam := range []ipFamilies{familyIPv4, familyIPv6} {
					flows = appendStaleFlows(flows, staleFlowsOf(ap, moves[i]), fam)
				}
			} else {
				flows = appendStaleFlows(flows, staleFlowsOf(ap, moves.of(clearing)), clearing)
			}
		}
		if rest := pending &^ fams; rest != 0 && p.active[name] != nil {
			p.pendingConntrack[name] = rest
			if moves.forget(fams) {
				delete(p.policyMoved, name)
			} else if _, ok := p.policyMoved[name]; ok {
				p.policyMoved[name] = moves
			}
		} else {
			delete(p.pendingConntrack, name)
			delete(p.policyMoved, name)
		}
	}
	// Last: a destination also named above (a Service re-created on it)
	// is cleared with the ports of every socket now serving it spared.
	flows = append(flows, p.closedFlows(fams)...)
	for dst, pending := range p.closedUDP {
		if rest := pending &^ fams; rest != 0 {
			p.closedUDP[dst] = rest
		} else {
			delete(p.closedUDP, dst)
		}
	}
	if len(flows) == 0 {
		return
	}
	if err := p.opts.Conntrack.ClearStale(flows); err != nil {
		klog.ErrorS(err, "Failed to clear stale conntrack entries", "destinations", len(flows))
	}
}

// movedFrom is where a service port's external addresses sent clients
// from other hosts and from the node and pods before its traffic policy
// changed (externalTargets).
type movedFrom struct{ outside, inside int }

// familyMoves are, per family (IPv4, IPv6), where the rules in the kernel
// moved clients from: the rules of the policy before the first change
// since that family's entries were last cleared (nil: none since). A
// family whose rules keep failing keeps its own while the other's are
// cleared, and the policy changes again.
type familyMoves [2]*movedFrom

// of is the record of the families fams, one of them or both alike.
func (m familyMoves) of(fams ipFamilies) *movedFrom {
	if fams&familyIPv4 != 0 {
		return m[0]
	}
	return m[1]
}

// forget drops the records of the families fams (cleared), and reports
// whether none is left.
func (m *familyMoves) forget(fams ipFamilies) bool {
	if fams&familyIPv4 != 0 {
		m[0] = nil
	}
	if fams&familyIPv6 != 0 {
		m[1] = nil
	}
	return m[0] == nil && m[1] == nil
}

// appendStaleFlows appends those of flows that have destinations in fams,
// restricted to them.
func appendStaleFlows(out, flows []StaleFlows, fams ipFamilies) []StaleFlows {
	for _, f := range flows {
		if f, ok := f.inFamilies(fams); ok {
			out = append(out, f)
		}
	}
	return out
}

// policyChanged remembers, for the next clearing of ap's stale flows
// (staleFlowsToClear), where its external addresses sent each kind of
// client before its traffic policy changed; called before the change.
func (p *Proxier) policyChanged(ap *activePort) {
	if p.opts.Conntrack == nil || ap.info.name.Protocol != v1.ProtocolUDP {
		return
	}
	if p.policyMoved == nil {
		p.policyMoved = map[loadbalancer.ServicePortName]familyMoves{}
	}
	moves := p.policyMoved[ap.info.name]
	outside, inside := ap.externalTargets()
	before := &movedFrom{outside, inside}
	for i := range moves {
		// A family changed again before its entries were cleared (its
		// rule write failing meanwhile) still has the first rules: its
		// record stays. The other's rules are this change's old ones.
		if moves[i] == nil {
			moves[i] = before
		}
	}
	p.policyMoved[ap.info.name] = moves
	// Cleared with the port's entries, which forgets the record (a reopen
	// that fails does not get to ask for it).
	p.staleFlowsToClear(ap.info.name)
}

// staleFlowsOf names the entries that would keep clients away from a new
// proxy socket of ap, or from the right one after its traffic policy
// changed (moved; nil: it did not).
func staleFlowsOf(ap *activePort, moved *movedFrom) []StaleFlows {
	info := ap.info
	var flows []StaleFlows
	switch info.name.Protocol {
	case v1.ProtocolUDP:
		// A ClusterIP is served by the cluster-wide socket; external
		// destinations by the external one when there is one (Local
		// external traffic): an entry NATed to the cluster-wide socket
		// predates it, and a client that keeps its source port (a
		// resolver, a syslog sender) would stay on cluster-wide endpoints
		// for as long as it sends. Pod and node flows that the shortcut
		// sends to the cluster-wide socket are NATed there again at their
		// next datagram: a one-off new session. Under both policies Local
		// external clients meet the cluster IP's node-local socket.
		// After a traffic-policy change (moved: where the external
		// addresses sent each kind of client before), a socket is spared
		// only where every client the old rules sent there is still sent
		// there: an ITP flip under ETP Local swaps the two sockets'
		// endpoint sets, and a pod's entry on the socket the shortcut
		// used before would keep it on the wrong set (with no local
		// endpoint, refused) for as long as it kept its source port.
		live := []int{ap.proxyPort}
		outside, inside := ap.externalTargets()
		var external []int
		switch {
		case outside == 0:
			// No portal there while a Local policy's second socket is
			// missing: no entry to them is live (the cluster IP's
			// socket was spared, and an external client NATed to it
			// before the policy became Local stayed on every node's
			// endpoints).
		case moved == nil:
			external = []int{outside}
		default:
			for _, port := range []int{ap.proxyPort, ap.externalPort} {
				if port != 0 && (moved.outside != port || outside == port) && (moved.inside != port || inside == port) {
					external = append(external, port)
				}
			}
		}
		for _, ip := range info.clusterIPs {
			flows = append(flows, StaleFlows{Protocol: v1.ProtocolUDP, Dst: netip.AddrPortFrom(ip, uint16(info.port)), Live: live})
		}
		for _, group := range [][]netip.Addr{info.externalIPs, info.loadBalancerIPs} {
			for _, ip := range group {
				flows = append(flows, StaleFlows{Protocol: v1.ProtocolUDP, Dst: netip.AddrPortFrom(ip, uint16(info.port)), Live: external})
			}
		}
		if info.nodePort != 0 {
			flows = append(flows, StaleFlows{Protocol: v1.ProtocolUDP, Dst: netip.AddrPortFrom(netip.Addr{}, uint16(info.nodePort)), Live: external})
		}
	case v1.ProtocolTCP:
		// A NodePort's reset connections only: its destination is the node
		// itself, where an early SYN was answered (by a reset or our claim)
		// and left no lasting entry, and clearing every un-NATed entry to
		// "any address, that port" would reach the node's own connections
		// to that port elsewhere. A reset one NATed to a port no socket of
		// ours holds (the proxy it overlapped in a rolling restart reset it
		// at its exit, or the last one's port was taken) sent a client
		// reusing its source port to the dead port, refused for as long as
		// it retried; a reset connection is over, whoever NATed it.
		// Reset connections are spared on either socket of the port: the
		// node reaches external addresses through the cluster-wide one.
		live := []int{ap.proxyPort}
		if ap.external != nil {
			live = append(live, ap.externalPort)
		}
		for _, group := range [][]netip.Addr{info.clusterIPs, info.externalIPs, info.loadBalancerIPs} {
			for _, ip := range group {
				flows = append(flows, StaleFlows{Protocol: v1.ProtocolTCP, Dst: netip.AddrPortFrom(ip, uint16(info.port)), Live: live})
			}
		}
		if info.nodePort != 0 {
			flows = append(flows, StaleFlows{Protocol: v1.ProtocolTCP, Dst: netip.AddrPortFrom(netip.Addr{}, uint16(info.nodePort)), Live: live, ResetOnly: true})
		}
	}
	return flows
}

// closedFlows names the entries, in the families fams, to the
// destinations UDP ports closed or lost: all of them, but those NATed to a
// socket that serves the destination now (another service port opened on
// it, or sharing an external IP), which are live flows.
func (p *Proxier) closedFlows(fams ipFamilies) []StaleFlows {
	if len(p.closedUDP) == 0 {
		return nil
	}
	live := map[netip.AddrPort][]int{}
	for _, ap := range p.active {
		if ap.info.name.Protocol != v1.ProtocolUDP {
			continue
		}
		udpDestinations(ap.info, func(dst netip.AddrPort) {
			if _, ok := p.closedUDP[dst]; !ok {
				return
			}
			live[dst] = append(live[dst], ap.proxyPort)
			if ap.external != nil {
				live[dst] = append(live[dst], ap.externalPort)
			}
		})
	}
	flows := make([]StaleFlows, 0, len(p.closedUDP))
	for dst, pending := range p.closedUDP {
		// An empty Live: no port is live, every entry to dst is stale.
		f := StaleFlows{Protocol: v1.ProtocolUDP, Dst: dst, Live: append([]int{}, live[dst]...)}
		if f, ok := f.inFamilies(pending & fams); ok {
			flows = append(flows, f)
		}
	}
	return flows
}
