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

// keptPorts is what the first sync keeps: the port the kernel's rules
// name for each socket of a wanted service port, and those of them
// reserved in the allocator and not claimed yet. A later sync keeps the
// ports of the sockets it reopens the same way (closeForReopen).
type keptPorts struct {
	cluster, external map[loadbalancer.ServicePortName]int
	reserved          map[int]bool
	claimed           int
	// successions and externalSuccessions are the sockets closeForReopen
	// set aside for the sockets that replace them (udp_handover.go);
	// those no socket took are closed with the sync's unclaimed ports.
	successions, externalSuccessions map[loadbalancer.ServicePortName]*succession
	// removedFaults are the fault ports of reopened sockets that were
	// renamed, removed once the sockets set aside are closed.
	removedFaults []string
}

// reserveKeptPorts reads both families' portals and reserves, for each
// service port of want, the proxy port they name for its cluster IP's
// socket (a host portal of a cluster IP) and for its second one (split
// policies): a container portal of an external address, or of its
// NodePort, and with both policies Local a host one (the shortcut's); a
// failure to read only costs the reuse. Ports
// of Services deleted meanwhile are not reserved: with an explicit range
// nearly full, a Service created meanwhile needs one.
func (p *Proxier) reserveKeptPorts(want map[loadbalancer.ServicePortName]*servicePortInfo) *keptPorts {
	host, container := map[iptables.PortalKey]int{}, map[iptables.PortalKey]int{}
	for _, f := range []struct {
		s      PortalSyncer
		family string
	}{{p.opts.IPv4Portals, ipv4Family}, {p.opts.IPv6Portals, ipv6Family}} {
		r, ok := f.s.(proxyPortReader)
		if !ok {
			continue
		}
		kp, err := r.ProxyPortsInKernel()
		if err != nil {
			klog.ErrorS(err, "Cannot read the proxy ports of the portals in the kernel; opening new ones", "family", f.family)
			continue
		}
		maps.Copy(host, kp.Host)
		maps.Copy(container, kp.Container)
	}
	k := &keptPorts{cluster: map[loadbalancer.ServicePortName]int{}, external: map[loadbalancer.ServicePortName]int{}}
	var ports []int
	for name, info := range want {
		proto := portalProtocol(info.name.Protocol)
		for _, ip := range info.clusterIPs {
			if port := host[iptables.PortalKey{Name: info.key, Protocol: proto, IP: ip, Port: info.port}]; port > 0 {
				k.cluster[name] = port
				ports = append(ports, port)
				break
			}
		}
		if !info.policy.splitExternal() {
			continue
		}
		keys := []iptables.PortalKey{{Name: info.key, Protocol: proto, Port: info.nodePort}} // the NodePort
		for _, ip := range slices.Concat(info.externalIPs, info.loadBalancerIPs) {
			keys = append(keys, iptables.PortalKey{Name: info.key, Protocol: proto, IP: ip, Port: info.port})
		}
		// Under both policies Local external clients meet the cluster
		// IP's socket and the second one is the shortcut's, which the
		// node's own traffic meets (host portals).
		of := container
		if info.policy.bothLocal() {
			of = host
		}
		for _, key := range keys {
			if port := of[key]; port > 0 {
				if port != k.cluster[name] { // the rules of another policy
					k.external[name] = port
					ports = append(ports, port)
				}
				break
			}
		}
	}
	k.reserved = p.ports.Reserve(ports)
	p.lostFlowsToClear(want, host, container)
	return k
}

// lostFlowsToClear remembers the UDP destinations the portals of the proxy
// before this one had and no wanted service port has (a Service deleted,
// its NodePort or ClusterIP changed while no proxy ran), for the clearing
// closedFlowsToClear does while one runs: a client that keeps its source
// port kept being served at an address the Service had given up, or by
// whichever Service was given the old proxy port (the lifecycle sweep: a
// deleted Service's clients answered by another Service's backends after a
// restart).
func (p *Proxier) lostFlowsToClear(want map[loadbalancer.ServicePortName]*servicePortInfo, portals ...map[iptables.PortalKey]int) {
	if p.opts.Conntrack == nil {
		return
	}
	wanted := map[netip.AddrPort]bool{}
	for _, info := range want {
		if info.name.Protocol == v1.ProtocolUDP {
			udpDestinations(info, func(dst netip.AddrPort) { wanted[dst] = true })
		}
	}
	for _, m := range portals {
		for key := range m {
			// A NodePort's key has no address, as udpDestinations names it.
			if dst := netip.AddrPortFrom(key.IP, uint16(key.Port)); key.Protocol == iptables.UDP && !wanted[dst] {
				p.closedUDP[dst] = dstFamilies(dst)
			}
		}
	}
}

// claim is the reserved port of info's cluster-wide socket, now the
// caller's to open (PortAllocator.OpenPreferred), or 0.
func (k *keptPorts) claim(info *servicePortInfo) int {
	if k == nil {
		return 0
	}
	return k.take(k.cluster[info.name])
}

// claimExternal is claim for info's node-local socket.
func (k *keptPorts) claimExternal(info *servicePortInfo) int {
	if k == nil {
		return 0
	}
	return k.take(k.external[info.name])
}

// claimSuccession is what the socket info's cluster-wide socket replaces
// leaves it (nil: nothing), now the caller's.
func (k *keptPorts) claimSuccession(info *servicePortInfo) *succession {
	if k == nil {
		return nil
	}
	s := k.successions[info.name]
	delete(k.successions, info.name)
	return s
}

// claimExternalSuccession is claimSuccession for info's second socket.
func (k *keptPorts) claimExternalSuccession(info *servicePortInfo) *succession {
	if k == nil {
		return nil
	}
	s := k.externalSuccessions[info.name]
	delete(k.externalSuccessions, info.name)
	return s
}

func (k *keptPorts) take(port int) int {
	if !k.reserved[port] {
		return 0
	}
	delete(k.reserved, port)
	k.claimed++
	return port
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
	for _, m := range []map[loadbalancer.ServicePortName]*succession{k.successions, k.externalSuccessions} {
		for name, s := range m {
			s.abandon()
			delete(m, name)
		}
	}
	// Every socket set aside is closed now.
	for _, name := range k.removedFaults {
		p.opts.Faults.RemovePort(name)
	}
	k.removedFaults = nil
	if k.claimed > 0 || len(k.reserved) > 0 {
		klog.V(1).InfoS("Proxy ports kept from the portals in the kernel or reopened sockets", "claimed", k.claimed, "released", len(k.reserved))
	}
	k.reserved = nil
}
