package proxier

import (
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// nodeTopology is where this proxy runs, for node-local policies and
// topology hints.
type nodeTopology struct {
	name string
	zone string
}

// trafficPolicy is the part of a Service that decides which endpoints get
// which traffic, as kube-proxy applies it.
type trafficPolicy struct {
	internalLocal bool // internalTrafficPolicy: Local (ClusterIP traffic)
	externalLocal bool // externalTrafficPolicy: Local (NodePort, externalIP, LB IP traffic)
	hasExternal   bool // the Service has NodePorts, externalIPs or LB IPs
	preferNode    bool // trafficDistribution: PreferSameNode
}

func policyOf(svc *v1.Service) trafficPolicy {
	p := trafficPolicy{
		internalLocal: svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal,
		hasExternal: svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer ||
			len(svc.Spec.ExternalIPs) > 0,
		preferNode: svc.Spec.TrafficDistribution != nil && *svc.Spec.TrafficDistribution == v1.ServiceTrafficDistributionPreferSameNode,
	}
	p.externalLocal = p.hasExternal && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	return p
}

// splitExternal reports whether external traffic needs its own endpoint
// set, and so its own proxy socket: a socket cannot tell which portal a
// connection came through, so each distinct endpoint set gets a socket.
func (p trafficPolicy) splitExternal() bool {
	return p.hasExternal && p.internalLocal != p.externalLocal
}

// internalEndpoints are those for ClusterIP traffic (and for all traffic
// when the policies agree).
func (p trafficPolicy) internalEndpoints(eps []loadbalancer.Endpoint, node nodeTopology) []loadbalancer.Endpoint {
	if p.internalLocal {
		return onNode(eps, node.name)
	}
	return topologyFiltered(eps, node, p.preferNode)
}

// externalEndpoints are those for NodePort, externalIP and LB IP traffic.
// Local means node-local only: external traffic to a node without a local
// endpoint is refused, never sent elsewhere (which would lose the client IP).
func (p trafficPolicy) externalEndpoints(eps []loadbalancer.Endpoint, node nodeTopology) []loadbalancer.Endpoint {
	if p.externalLocal {
		return onNode(eps, node.name)
	}
	return topologyFiltered(eps, node, p.preferNode)
}

func onNode(eps []loadbalancer.Endpoint, node string) []loadbalancer.Endpoint {
	out := []loadbalancer.Endpoint{}
	for _, e := range eps {
		if node != "" && e.NodeName == node {
			out = append(out, e)
		}
	}
	return out
}

func countReadyLocal(eps []loadbalancer.Endpoint, node string) int {
	n := 0
	for _, e := range eps {
		if node != "" && e.NodeName == node && e.Ready {
			n++
		}
	}
	return n
}

// topologyFiltered applies EndpointSlice hints as kube-proxy does: node
// hints when the Service prefers the same node and some ready endpoint is
// hinted for this node; otherwise zone hints, but only when every ready
// endpoint carries them and at least one ready endpoint is hinted for this
// node's zone (partial hints mean the controller is mid-update, so all
// endpoints are used). Only ready endpoints count: a non-ready one hinted
// for this zone must not switch hints on, or a node whose zone has no ready
// endpoint would reset every connection. The filtered set is the ready
// hinted endpoints, as kube-proxy's.
func topologyFiltered(eps []loadbalancer.Endpoint, node nodeTopology, preferNode bool) []loadbalancer.Endpoint {
	if preferNode && node.name != "" {
		if out := hinted(eps, func(e loadbalancer.Endpoint) bool { return slices.Contains(e.NodeHints, node.name) }); len(out) > 0 {
			return out
		}
	}
	if node.zone == "" {
		return eps
	}
	for _, e := range eps {
		if e.Ready && len(e.ZoneHints) == 0 {
			return eps
		}
	}
	if out := hinted(eps, func(e loadbalancer.Endpoint) bool { return slices.Contains(e.ZoneHints, node.zone) }); len(out) > 0 {
		return out
	}
	return eps
}

// hinted returns the ready endpoints that keep accepts.
func hinted(eps []loadbalancer.Endpoint, keep func(loadbalancer.Endpoint) bool) []loadbalancer.Endpoint {
	var out []loadbalancer.Endpoint
	for _, e := range eps {
		if e.Ready && keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// externalName is the balancer entry of a service port's external traffic
// when it differs from its internal traffic. The suffix cannot clash with a
// real port name: those are DNS labels, without '@'.
func externalName(spn loadbalancer.ServicePortName) loadbalancer.ServicePortName {
	spn.Port += "@external"
	return spn
}
