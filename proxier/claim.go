package proxier

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// claim opens (and never reads) sockets on the NodePort and on external IPs
// that are local to this node, as the legacy proxier did: the kernel then
// refuses them to any other process, instead of that process silently
// losing its traffic to our portal rules.
func (p *Proxier) claim(info *servicePortInfo) []func() error {
	var closers []func() error
	network := "tcp"
	if info.name.Protocol == v1.ProtocolUDP {
		network = "udp"
	}
	hold := func(addr string) {
		c, err := holdPort(network, addr)
		if err != nil {
			klog.ErrorS(err, "Cannot claim port; another process holds it", "servicePort", info.name, "address", addr)
			return
		}
		closers = append(closers, c)
	}
	if info.nodePort != 0 {
		hold(fmt.Sprintf(":%d", info.nodePort))
	}
	for _, ip := range info.externalIPs {
		if isLocalAddress(ip) {
			hold(netip.AddrPortFrom(ip, uint16(info.port)).String())
		}
	}
	return closers
}

func holdPort(network, addr string) (func() error, error) {
	if network == "tcp" {
		ln, err := listenConfig.Listen(context.Background(), network, addr)
		if err != nil {
			return nil, err
		}
		return ln.Close, nil
	}
	pc, err := listenConfig.ListenPacket(context.Background(), network, addr)
	if err != nil {
		return nil, err
	}
	return pc.Close, nil
}

func (p *Proxier) releaseClaims(ap *activePort) {
	for _, c := range ap.claims {
		_ = c()
	}
	ap.claims = nil
}

func isLocalAddress(ip netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if la, ok := netip.AddrFromSlice(n.IP); ok && la.Unmap() == ip {
				return true
			}
		}
	}
	return false
}
