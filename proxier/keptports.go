package proxier

import (
	"maps"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// A proxy started over the portals of the one before it (a restart, an
// upgrade) opens each service port's socket on the port those rules
// already send it to, where the port allocator allows it and no one holds
// it. Its first sync then finds the rules right and rewrites none of them
// (10,000 Services: a restart's sync was a rewrite of every rule), and
// clients of a Service reach the new socket as soon as it listens, where
// with a new port they were refused until the rules were rewritten.

// proxyPortReader is a PortalSyncer that can say which proxy port each
// portal in the kernel names (iptables.Rules).
type proxyPortReader interface {
	ProxyPortsInKernel() (map[iptables.PortalKey]int, error)
}

// readKeptPorts reads both families' portals; a failure only costs the
// reuse.
func (p *Proxier) readKeptPorts() map[iptables.PortalKey]int {
	out := map[iptables.PortalKey]int{}
	for _, f := range []struct {
		s      PortalSyncer
		family string
	}{{p.opts.IPv4Portals, "IPv4"}, {p.opts.IPv6Portals, "IPv6"}} {
		r, ok := f.s.(proxyPortReader)
		if !ok {
			continue
		}
		ports, err := r.ProxyPortsInKernel()
		if err != nil {
			klog.ErrorS(err, "Cannot read the proxy ports of the portals in the kernel; opening new ones", "family", f.family)
			continue
		}
		maps.Copy(out, ports)
	}
	if len(out) > 0 {
		klog.V(1).InfoS("Portals in the kernel name proxy ports; listening on them again where free", "portals", len(out))
	}
	return out
}

// keptPort is the proxy port the kernel's portal of one of info's cluster
// IPs names, or 0.
func keptPort(kept map[iptables.PortalKey]int, info *servicePortInfo) int {
	if len(kept) == 0 {
		return 0
	}
	proto := iptables.TCP
	if info.name.Protocol == v1.ProtocolUDP {
		proto = iptables.UDP
	}
	for _, ip := range info.clusterIPs {
		if port, ok := kept[iptables.PortalKey{Name: info.key, Protocol: proto, IP: ip, Port: info.port}]; ok {
			return port
		}
	}
	return 0
}
