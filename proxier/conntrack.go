package proxier

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// ConntrackCleaner removes conntrack entries that would keep a client away
// from a new proxy socket. A flow's entry keeps its first NAT decision:
//   - UDP: for as long as the client keeps sending, so when a service's
//     proxy port changes (a restart, a re-created Service) a client that
//     reuses its source port, as DNS resolvers do, would keep hitting the
//     old, closed port forever. kube-proxy clears entries for the same reason.
//   - TCP: a SYN sent to a service IP before its portal existed leaves an
//     un-NATed SYN_SENT entry for 120 s, so the client's retransmissions, and
//     a new connection from the same source port, bypass the portal.
type ConntrackCleaner interface {
	// ClearStaleUDP deletes UDP entries whose original destination is
	// addr:port (with an invalid addr, every entry to that destination port:
	// NodePorts), except those a portal NATed to one of the live proxy
	// ports: those flows already reach a socket of ours, and an entry
	// deleted under a flow in full swing turns the replies in flight into
	// un-NATed datagrams the client's connected socket drops.
	ClearStaleUDP(addr netip.Addr, port int, live []int) error
	// ClearUnNATedTCP deletes TCP entries whose original destination is
	// addr:port and that no NAT rewrote: those that passed a portal, and so
	// live connections, stay.
	ClearUnNATedTCP(addr netip.Addr, port int) error
}

// NetlinkConntrack talks to the kernel's conntrack table over netlink.
type NetlinkConntrack struct{}

func (NetlinkConntrack) ClearStaleUDP(addr netip.Addr, port int, live []int) error {
	families := []netlink.InetFamily{unix.AF_INET, unix.AF_INET6}
	switch {
	case addr.Is4():
		families = families[:1]
	case addr.Is6():
		families = families[1:]
	}
	filter := staleUDP{dst: netip.AddrPortFrom(addr, uint16(port)), live: live}
	for _, f := range families {
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, f, filter); err != nil {
			return fmt.Errorf("conntrack delete udp %v:%d: %w", addr, port, err)
		}
	}
	return nil
}

// staleUDP matches UDP flows to dst (to any address when dst's is invalid)
// that no portal sent to a live proxy port: un-NATed flows, tracked before
// the portal existed, and flows NATed to a port no socket of ours serves.
type staleUDP struct {
	dst  netip.AddrPort
	live []int
}

func (f staleUDP) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_UDP || flow.Forward.DstPort != f.dst.Port() {
		return false
	}
	orig, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	if !ok || f.dst.Addr().IsValid() && orig.Unmap() != f.dst.Addr().Unmap() {
		return false
	}
	replySrc, ok := netip.AddrFromSlice(flow.Reverse.SrcIP)
	if !ok {
		return true
	}
	natted := replySrc.Unmap() != orig.Unmap() || flow.Reverse.SrcPort != flow.Forward.DstPort
	return !natted || !slices.Contains(f.live, int(flow.Reverse.SrcPort))
}

func (NetlinkConntrack) ClearUnNATedTCP(addr netip.Addr, port int) error {
	family := netlink.InetFamily(unix.AF_INET)
	if addr.Is6() {
		family = unix.AF_INET6
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, unNATedTCP{netip.AddrPortFrom(addr, uint16(port))}); err != nil {
		return fmt.Errorf("conntrack delete tcp %v:%d: %w", addr, port, err)
	}
	return nil
}

// unNATedTCP matches TCP flows to dst whose reply comes from dst itself,
// i.e. no DNAT or REDIRECT rewrote them.
type unNATedTCP struct{ dst netip.AddrPort }

func (f unNATedTCP) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_TCP || flow.Forward.DstPort != f.dst.Port() {
		return false
	}
	orig, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	if !ok || orig.Unmap() != f.dst.Addr() {
		return false
	}
	replySrc, ok := netip.AddrFromSlice(flow.Reverse.SrcIP)
	return ok && replySrc.Unmap() == orig.Unmap() && flow.Reverse.SrcPort == f.dst.Port()
}

// staleFlowsToClear remembers a service port whose proxy socket is new, so
// its stale conntrack entries are cleared once a portal sync has succeeded:
// before that new flows would meet the old rules, and a failed sync must not
// forget the port (the list is kept until a sync succeeds).
func (p *Proxier) staleFlowsToClear(name loadbalancer.ServicePortName) {
	if p.opts.Conntrack == nil {
		return
	}
	if p.pendingConntrack == nil {
		p.pendingConntrack = map[loadbalancer.ServicePortName]struct{}{}
	}
	p.pendingConntrack[name] = struct{}{}
}

// clearStaleFlows clears the entries of every pending service port that is
// still served, then forgets them all. Called after a successful sync.
func (p *Proxier) clearStaleFlows() {
	for name := range p.pendingConntrack {
		if ap := p.active[name]; ap != nil {
			p.clearStale(ap)
		}
	}
	clear(p.pendingConntrack)
}

func (p *Proxier) clearStale(ap *activePort) {
	info := ap.info
	var serviceIPs []netip.Addr
	for _, group := range [][]netip.Addr{info.clusterIPs, info.externalIPs, info.loadBalancerIPs} {
		serviceIPs = append(serviceIPs, group...)
	}
	if info.name.Protocol == v1.ProtocolTCP {
		// Service IPs only: a NodePort's destination is the node itself, where
		// an early SYN was answered (by a reset or our claim) and left no
		// lasting entry, and clearing "any address, that port" would reach
		// the node's unrelated connections.
		for _, ip := range serviceIPs {
			if err := p.opts.Conntrack.ClearUnNATedTCP(ip, info.port); err != nil {
				klog.ErrorS(err, "Failed to clear stale TCP conntrack entries", "servicePort", info.name)
			}
		}
		return
	}
	if info.name.Protocol != v1.ProtocolUDP {
		return
	}
	targets := make([]netip.AddrPort, 0, len(serviceIPs)+1)
	for _, ip := range serviceIPs {
		targets = append(targets, netip.AddrPortFrom(ip, uint16(info.port)))
	}
	if info.nodePort != 0 {
		targets = append(targets, netip.AddrPortFrom(netip.Addr{}, uint16(info.nodePort)))
	}
	live := []int{ap.proxyPort}
	if ap.external != nil {
		live = append(live, ap.externalPort)
	}
	for _, t := range targets {
		if err := p.opts.Conntrack.ClearStaleUDP(t.Addr(), int(t.Port()), live); err != nil {
			klog.ErrorS(err, "Failed to clear stale UDP conntrack entries", "servicePort", info.name)
		}
	}
}
