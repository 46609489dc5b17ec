package proxier

import (
	"maps"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// A proxy started over the portals of the one before it (a restart, an
// upgrade) opens each service port's socket on the port those rules
// already send it to, where the port allocator allows it and no one holds
// it. Its first sync then finds the rules right and rewrites none of them
// (10,000 Services: a restart's sync was a rewrite of every rule), and
// clients of a Service reach the new socket as soon as it listens, where
// with a new port they were refused until the rules were rewritten. Every
// port the old rules name for a service port still wanted is reserved
// before the first socket opens, so no other service port (a Service created meanwhile, an
// externalTrafficPolicy: Local socket) is given one of them and receives,
// until the rules are rewritten, another Service's clients. Reserved ports
// no service port claimed are given back once the sync's sockets are open.

// proxyPortReader is a PortalSyncer that can say which proxy ports the
// portals in the kernel name (iptables.Rules).
type proxyPortReader interface {
	ProxyPortsInKernel() (iptables.KernelPortals, error)
}

// keptPorts is what the first sync keeps: each portal's ports, and the
// ports reserved in the allocator and not opened yet.
type keptPorts struct {
	host, container map[iptables.PortalKey]int
	reserved        map[int]bool
	claimed         int
}

// reserveKeptPorts reads both families' portals and reserves every proxy
// port they name for a service port of want; a failure to read only costs
// the reuse. Ports of Services deleted meanwhile are not reserved: with an
// explicit range nearly full, a Service created meanwhile needs one.
func (p *Proxier) reserveKeptPorts(want map[loadbalancer.ServicePortName]*servicePortInfo) *keptPorts {
	k := &keptPorts{host: map[iptables.PortalKey]int{}, container: map[iptables.PortalKey]int{}}
	for _, f := range []struct {
		s      PortalSyncer
		family string
	}{{p.opts.IPv4Portals, "IPv4"}, {p.opts.IPv6Portals, "IPv6"}} {
		r, ok := f.s.(proxyPortReader)
		if !ok {
			continue
		}
		kp, err := r.ProxyPortsInKernel()
		if err != nil {
			klog.ErrorS(err, "Cannot read the proxy ports of the portals in the kernel; opening new ones", "family", f.family)
			continue
		}
		maps.Copy(k.host, kp.Host)
		maps.Copy(k.container, kp.Container)
	}
	var claimable []int
	for _, info := range want {
		for _, key := range k.hostKeys(info) {
			if port := k.host[key]; port > 0 {
				claimable = append(claimable, port)
			}
		}
		if info.policy.splitExternal() {
			for _, key := range k.externalKeys(info) {
				if port := k.container[key]; port > 0 {
					claimable = append(claimable, port)
				}
			}
		}
	}
	slices.Sort(claimable)
	k.reserved = p.ports.Reserve(slices.Compact(claimable))
	return k
}

// claim is the reserved port the kernel's host portal of one of info's
// cluster IPs names (its cluster-wide socket's), now info's to open, or 0.
// The caller opens it (PortAllocator.OpenPreferred).
func (k *keptPorts) claim(info *servicePortInfo) int {
	if k == nil {
		return 0
	}
	return k.claimFirst(k.host, k.hostKeys(info))
}

// hostKeys are the portals of info's cluster IPs.
func (k *keptPorts) hostKeys(info *servicePortInfo) []iptables.PortalKey {
	var keys []iptables.PortalKey
	for _, ip := range info.clusterIPs {
		keys = append(keys, portalKey(info, ip, info.port))
	}
	return keys
}

// claimExternal is claim for the socket of info's external traffic under
// externalTrafficPolicy: Local: the port the container portal of an
// external address, or the NodePort, names.
func (k *keptPorts) claimExternal(info *servicePortInfo) int {
	if k == nil {
		return 0
	}
	return k.claimFirst(k.container, k.externalKeys(info))
}

// externalKeys are the portals of info's external addresses and NodePort.
func (k *keptPorts) externalKeys(info *servicePortInfo) []iptables.PortalKey {
	var keys []iptables.PortalKey
	for _, ip := range slices.Concat(info.externalIPs, info.loadBalancerIPs) {
		keys = append(keys, portalKey(info, ip, info.port))
	}
	if info.nodePort != 0 {
		keys = append(keys, portalKey(info, netip.Addr{}, info.nodePort))
	}
	return keys
}

func (k *keptPorts) claimFirst(ports map[iptables.PortalKey]int, keys []iptables.PortalKey) int {
	for _, key := range keys {
		if port := ports[key]; k.reserved[port] {
			delete(k.reserved, port)
			k.claimed++
			return port
		}
	}
	return 0
}

func portalKey(info *servicePortInfo, ip netip.Addr, port int) iptables.PortalKey {
	proto := iptables.TCP
	if info.name.Protocol == v1.ProtocolUDP {
		proto = iptables.UDP
	}
	return iptables.PortalKey{Name: info.key, Protocol: proto, IP: ip, Port: port}
}

// releaseKeptPorts gives back the reserved ports no service port claimed
// (their rules are rewritten by this sync).
func (p *Proxier) releaseKeptPorts(k *keptPorts) {
	if k == nil {
		return
	}
	for port := range k.reserved {
		p.ports.Release(port)
	}
	if k.claimed > 0 || len(k.reserved) > 0 {
		klog.V(1).InfoS("Proxy ports kept from the portals in the kernel", "claimed", k.claimed, "released", len(k.reserved))
	}
	k.reserved = nil
}
