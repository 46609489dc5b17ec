package proxier

import (
	"iter"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// closeForReopen closes ap's sockets so that they reopen for info under
// the same service port name (a new address family, an unnamed port's new
// number, a proxy port that is now a node port). What belongs to the name
// stays: the balancer's entries, so ClientIP affinity pins survive, the
// connection lifetimes and metric series of its live connections, and the
// fault port unless it is renamed. So do its proxy ports, but for a node
// port: they stay taken in the allocator and are handed to kept
// (keptports.go), for the new sockets to open on them, so the portals
// change only where the Service did (a listen that fails there takes
// another port). Closing the port and opening a new one dropped the
// pins and moved every portal to a new proxy port.
func (p *Proxier) closeForReopen(kept *keptPorts, name loadbalancer.ServicePortName, ap *activePort, info *servicePortInfo) *keptPorts {
	if kept == nil {
		kept = &keptPorts{cluster: map[loadbalancer.ServicePortName]int{}, external: map[loadbalancer.ServicePortName]int{}}
	}
	if kept.reserved == nil {
		kept.reserved = map[int]bool{}
	}
	if kept.successions == nil {
		kept.successions = map[loadbalancer.ServicePortName]*succession{}
		kept.externalSuccessions = map[loadbalancer.ServicePortName]*succession{}
	}
	// A UDP socket serves on until the socket that replaces it binds, and
	// hands it its live sessions (udp_handover.go).
	succ := setAside(name, ap.socket)
	kept.successions[name] = succ
	keep := func(ports map[loadbalancer.ServicePortName]int, port int) {
		if p.ports.isNodePort(port) {
			// A Service's node port now: the port is held for it (as
			// kube-proxy's holds come first) and the socket opens on
			// another, its rules rewritten by this sync. Kept, the hold
			// failed on every sync, blaming "another process".
			klog.InfoS("Proxy port is now a Service's node port; the service port moves to another proxy port",
				"servicePort", name, "protocol", name.Protocol, "proxyPort", port)
			p.ports.Release(port)
			p.endpoints.moved(name)
			return
		}
		ports[name] = port
		kept.reserved[port] = true
	}
	keep(kept.cluster, ap.proxyPort)
	if ap.external != nil {
		keep(kept.external, ap.externalPort)
		if info.policy.splitExternal() {
			kept.externalSuccessions[name] = setAside(name, ap.external)
		} else {
			// No external socket will reopen (its port is released with
			// the kept ports no socket claimed): it closes now, its
			// sessions going to the cluster-wide one, as a retired
			// socket's do.
			succ.closeWith(ap.external)
			p.lb.DeleteServicePort(externalName(name))
		}
	}
	p.releaseClaims(ap)
	if ap.info.faultName != info.faultName {
		// Removed once the sockets set aside, which serve with it until
		// their successors bind, are closed (releaseKeptPorts): removed
		// now, the datagrams they read meanwhile went into its emptied
		// delay lines and held --fault-max-buffered-bytes for the whole
		// delay, never to be delivered.
		kept.removedFaults = append(kept.removedFaults, ap.info.faultName)
	}
	delete(p.active, name)
	p.reopening[name] = struct{}{}
	p.openTouched = append(p.openTouched, name)
	p.debugTouched = append(p.debugTouched, name)
	return kept
}

// movesLast yields want's service ports, those with a socket on a node
// port last (when node ports changed), so that a move takes a port of
// --proxy-port-range only after the new service ports have taken theirs.
func (p *Proxier) movesLast(want map[loadbalancer.ServicePortName]*servicePortInfo, nodePortsChanged bool) iter.Seq2[loadbalancer.ServicePortName, *servicePortInfo] {
	return func(yield func(loadbalancer.ServicePortName, *servicePortInfo) bool) {
		var last []loadbalancer.ServicePortName
		for name, info := range want {
			if ap := p.active[name]; nodePortsChanged && ap != nil && p.onNodePort(ap) {
				last = append(last, name)
				continue
			}
			if !yield(name, info) {
				return
			}
		}
		for _, name := range last {
			if !yield(name, want[name]) {
				return
			}
		}
	}
}

// canMove reports whether the range has a free port for each socket of ap
// on a node port, and logs when it has not: the socket then stays, and the
// NodePort hold meets it (claim says so).
func (p *Proxier) canMove(name loadbalancer.ServicePortName, ap *activePort) bool {
	n := 0
	if p.ports.isNodePort(ap.proxyPort) {
		n++
	}
	if ap.external != nil && p.ports.isNodePort(ap.externalPort) {
		n++
	}
	if p.ports.hasFree(n) {
		return true
	}
	klog.InfoS("Proxy port is now a Service's node port, but --proxy-port-range has no free port to move to; the socket stays", "servicePort", name, "protocol", name.Protocol, "proxyPort", ap.proxyPort)
	return false
}

// onNodePort reports whether a socket of ap listens on a node port.
func (p *Proxier) onNodePort(ap *activePort) bool {
	return p.ports.isNodePort(ap.proxyPort) || ap.external != nil && p.ports.isNodePort(ap.externalPort)
}
