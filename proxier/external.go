package proxier

import (
	"maps"
	"net"
	"net/netip"
	"strconv"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// syncPolicies hands the traffic policy of every changed Service (its new
// ports, none when removed) to the endpoints tracker (which re-filters its
// endpoints when a policy changed) and the healthCheckNodePorts to the
// service health server (again after a failure, until it succeeds). It
// reports false when the health server refused them.
func (p *Proxier) syncPolicies(changed map[types.NamespacedName][]*servicePortInfo) bool {
	if p.healthPorts == nil {
		p.healthPorts = map[types.NamespacedName]int{}
		p.healthDirty = true
	}
	for nn, infos := range changed {
		health := 0
		for _, info := range infos {
			if info.policy.externalLocal && info.healthCheckNodePort != 0 {
				health = info.healthCheckNodePort
			}
		}
		if health != p.healthPorts[nn] {
			p.healthDirty = true
			if health == 0 {
				delete(p.healthPorts, nn)
			} else {
				p.healthPorts[nn] = health
			}
		}
		if len(infos) == 0 {
			// The tracker keeps the policies; forgetting one it does not
			// hold does nothing.
			p.endpoints.setPolicy(nn, trafficPolicy{}, false)
			p.endpoints.setFamilies(nn, 0)
			continue
		}
		p.endpoints.setPolicy(nn, servicePolicy(infos), true) // one policy per Service
		p.endpoints.setFamilies(nn, p.servedFamilies(infos[0]))
	}
	if p.opts.ServiceHealth != nil && p.healthDirty {
		if err := p.opts.ServiceHealth.SyncServices(maps.Clone(p.healthPorts)); err != nil {
			klog.ErrorS(err, "Failed to sync healthCheckNodePort servers")
			return false
		}
		p.healthDirty = false
	}
	return true
}

// syncExternalSocket opens or closes the second socket a service port needs
// while its external traffic has its own endpoint set; it opens it on the
// port the kernel's rules still name where it can (kept, keptports.go). It
// reports false when the socket it needs did not open.
func (p *Proxier) syncExternalSocket(ap *activePort, info *servicePortInfo, kept *keptPorts, logLine bool) bool {
	need := info.policy.splitExternal()
	switch {
	case need && ap.external == nil:
		ext := externalName(info.name)
		sp := p.lb.ServicePort(ext)
		p.setBalancerPolicy(ext, info)
		keptPort := kept.claimExternal(info)
		succ := kept.claimExternalSuccession(info)
		bind := p.listenAddrOf(info)
		sock, err := p.openSocket(keptPort, func(port int) (proxySocket, error) {
			succ.closeOld()
			return p.listen(info.name, bind, port, bind.Is6(), sp, ap.faults, p.sockCfg)
		})
		if err != nil {
			p.lb.DeleteServicePort(ext)
			succ.abandon()
			if p.fds.logged(err) {
				klog.ErrorS(err, "Failed to open external proxy socket", "servicePort", info.name)
			}
			if msg := "second proxy socket (external addresses): " + err.Error(); ap.externalErr != msg {
				ap.externalErr = msg
				p.debugTouched = append(p.debugTouched, info.name)
			}
			return false
		}
		succ.adoptBy(sock)
		sock.Start()
		ap.externalErr = ""
		p.movedOffKept(info, keptPort, sock.Port())
		ap.external, ap.externalPort = sock, sock.Port()
		p.debugTouched = append(p.debugTouched, info.name)
		if logLine || klog.V(2).Enabled() {
			// Only externalTrafficPolicy Local alone makes this socket's
			// endpoints node-local.
			var msg string
			switch {
			case info.policy.bothLocal():
				msg = "Serving the node's and pods' traffic to external addresses of service port on every node's endpoints (both traffic policies Local: external clients and the cluster IP keep this node's)"
			case info.policy.externalLocal:
				msg = "Serving external traffic of service port on node-local endpoints (externalTrafficPolicy: Local)"
			default:
				msg = "Serving external traffic of service port on every node's endpoints (externalTrafficPolicy: Cluster; internalTrafficPolicy: Local keeps the cluster IP's on this node)"
			}
			klog.InfoS(msg, "servicePort", info.name, "protocol", info.name.Protocol,
				"proxyAddress", net.JoinHostPort(p.listenHostOf(info), strconv.Itoa(ap.externalPort)))
		}
		// Its portals are new: flows sent while they were missing (a
		// failed open is retried with the rules unchanged) are stale.
		p.staleFlowsToClear(info.name)
	case !need && ap.external != nil:
		p.retireExternalSocket(ap)
	case !need && ap.externalErr != "":
		// No longer needed (the policy changed) before it could open.
		ap.externalErr = ""
		p.debugTouched = append(p.debugTouched, info.name)
	}
	return true
}

// retiredSocket is an external socket a sync no longer needs, closed once
// the rules that may name it are rewritten (closeRetired), or with its
// service port when that is removed (forgetRemoved).
type retiredSocket struct {
	sock proxySocket
	port int
	// svc is the service port's name (its balancer entry is svc's
	// externalName).
	svc loadbalancer.ServicePortName
	// waiting: the families whose rules may still name it, until a sync
	// writes them.
	waiting ipFamilies
}

// retireExternalSocket takes the external socket out of the service port
// (the rules this sync writes no longer send anything to it) but leaves it
// open until they are written and the stale flows cleared: closed first, a
// UDP client of the NodePort (external IPs, LB IPs) was refused with ICMP
// port unreachable until then (a TCP client reset), where kube-proxy
// serves it across the policy change. Meanwhile a UDP socket picks from
// the service port's own endpoints, as the new rules will: its own
// balancer lost them when the policy changed (the endpoints tracker, at
// the sync's start), and its clients were refused by it instead.
func (p *Proxier) retireExternalSocket(ap *activePort) {
	if u, ok := ap.external.(*udpProxySocket); ok {
		u.useBalancer(p.lb.ServicePort(ap.info.name))
	}
	p.retired = append(p.retired, retiredSocket{sock: ap.external, port: ap.externalPort, svc: ap.info.name, waiting: ap.info.serviceFamilies()})
	ap.external, ap.externalPort = nil, 0
	p.debugTouched = append(p.debugTouched, ap.info.name)
}

// closeRetired closes the sockets retireExternalSocket set aside once the
// rules of each of their families are written (written: those this sync
// wrote; a failed write left the kernel's sending their addresses to
// them), all of them at the proxy's exit. A service port that has a second
// socket again (its policy flipped back meanwhile) keeps the balancer
// entry, which that socket uses now.
func (p *Proxier) closeRetired(written ipFamilies) {
	kept := p.retired[:0]
	for _, r := range p.retired {
		if r.waiting &^= written; r.waiting != 0 {
			kept = append(kept, r)
			continue
		}
		// Its sessions go to the socket its clients reach now that
		// their entries NATed to it are cleared (clearStaleFlows ran
		// first): the service port's own, or its second socket again.
		h, _ := handOver(r.sock)
		p.ports.Release(r.port)
		switch ap := p.active[r.svc]; {
		case ap == nil:
			closeHanded(h)
		case ap.external != nil:
			adopt(ap.external, h)
		default:
			adopt(ap.socket, h)
		}
		if ap := p.active[r.svc]; ap == nil || ap.external == nil {
			p.lb.DeleteServicePort(externalName(r.svc))
		}
	}
	clear(p.retired[len(kept):])
	p.retired = kept
}

func (p *Proxier) closeExternalSocket(ap *activePort) {
	if ap.external == nil {
		return
	}
	_ = ap.external.Close()
	p.ports.Release(ap.externalPort)
	p.lb.DeleteServicePort(externalName(ap.info.name))
	ap.external, ap.externalPort = nil, 0
	p.debugTouched = append(p.debugTouched, ap.info.name)
}

// LocalEndpoints is the number of ready endpoints (pods) of a Service on
// this node, what its healthCheckNodePort reports; the larger family's
// for a dual-stack Service (LocalEndpointsAt answers a family).
func (p *Proxier) LocalEndpoints(svc types.NamespacedName) int {
	return p.endpoints.localEndpoints(svc, netip.Addr{})
}

// LocalEndpointsAt is what the healthCheckNodePort of svc reports to a
// check that arrived on the node address at: for a dual-stack Service the
// local pods of at's family, as kube-proxy's per-family proxiers answer,
// so a node whose local pods have no IPv4 address fails the check a load
// balancer makes on its IPv4 address (its IPv4 NodePort resets every
// client under externalTrafficPolicy Local); else LocalEndpoints.
func (p *Proxier) LocalEndpointsAt(svc types.NamespacedName, at netip.Addr) int {
	return p.endpoints.localEndpoints(svc, at)
}
