package proxier

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// ConntrackCleaner removes UDP conntrack entries. A UDP flow's entry keeps
// its first NAT decision for as long as the client keeps sending, so when a
// service's proxy port changes (a restart, a re-created Service) a client
// that reuses its source port, as DNS resolvers do, would keep hitting the
// old, closed port forever. kube-proxy clears entries for the same reason.
type ConntrackCleaner interface {
	// ClearUDP deletes UDP entries whose original destination is addr:port;
	// with an invalid addr, every entry to that destination port (NodePorts).
	ClearUDP(addr netip.Addr, port int) error
}

// NetlinkConntrack talks to the kernel's conntrack table over netlink.
type NetlinkConntrack struct{}

func (NetlinkConntrack) ClearUDP(addr netip.Addr, port int) error {
	filter := &netlink.ConntrackFilter{}
	if err := filter.AddProtocol(unix.IPPROTO_UDP); err != nil {
		return err
	}
	if err := filter.AddPort(netlink.ConntrackOrigDstPort, uint16(port)); err != nil {
		return err
	}
	families := []netlink.InetFamily{unix.AF_INET, unix.AF_INET6}
	if addr.IsValid() {
		if err := filter.AddIP(netlink.ConntrackOrigDstIP, net.IP(addr.AsSlice())); err != nil {
			return err
		}
		families = families[:1]
		if addr.Is6() {
			families = []netlink.InetFamily{unix.AF_INET6}
		}
	}
	for _, f := range families {
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, f, filter); err != nil {
			return fmt.Errorf("conntrack delete udp %v:%d: %w", addr, port, err)
		}
	}
	return nil
}

// clearStaleUDP removes conntrack entries of service addresses whose UDP
// proxy socket is new.
func (p *Proxier) clearStaleUDP(infos []*servicePortInfo) {
	if p.opts.Conntrack == nil {
		return
	}
	for _, info := range infos {
		var targets []netip.AddrPort
		for _, group := range [][]netip.Addr{info.clusterIPs, info.externalIPs, info.loadBalancerIPs} {
			for _, ip := range group {
				targets = append(targets, netip.AddrPortFrom(ip, uint16(info.port)))
			}
		}
		if info.nodePort != 0 {
			targets = append(targets, netip.AddrPortFrom(netip.Addr{}, uint16(info.nodePort)))
		}
		for _, t := range targets {
			if err := p.opts.Conntrack.ClearUDP(t.Addr(), int(t.Port())); err != nil {
				klog.ErrorS(err, "Failed to clear stale UDP conntrack entries", "servicePort", info.name)
			}
		}
	}
}
