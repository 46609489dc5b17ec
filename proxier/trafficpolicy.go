package proxier

import (
	"net/netip"
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
	// hasExternal: the service port has an address outside traffic
	// arrives at on this node (its NodePort, or an externalIP or a VIP LB
	// IP of the Service's families), kube-proxy's ExternallyAccessible.
	hasExternal bool
}

// policyOf is the policy of a port of svc; reachable tells whether that
// port has an external address on this node (hasExternal). externalLocal
// follows the type, as kube-proxy's ExternalPolicyLocal does (its
// healthCheckNodePort and no-local-endpoints count are there before an LB
// IP is), but a second socket is only for a port that has somewhere to
// receive external traffic: a LoadBalancer with
// allocateLoadBalancerNodePorts false whose ingress is pending, or ipMode
// Proxy only, had one no rule led to.
func policyOf(svc *v1.Service, reachable bool) trafficPolicy {
	accessible := svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer ||
		len(svc.Spec.ExternalIPs) > 0
	return trafficPolicy{
		internalLocal: svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal,
		externalLocal: accessible && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal,
		hasExternal:   reachable,
	}
}

// servicePolicy is the one policy the endpoints tracker keeps for a
// Service (infos are its ports): theirs, with hasExternal when any port
// has an external address, so that each port that has one gets its
// second socket's endpoints (a port without one has an entry no socket
// reads).
func servicePolicy(infos []*servicePortInfo) trafficPolicy {
	policy := infos[0].policy
	for _, info := range infos[1:] {
		policy.hasExternal = policy.hasExternal || info.policy.hasExternal
	}
	return policy
}

// splitExternal reports whether the service port needs a second proxy
// socket, a socket not being able to tell which portal a connection came
// through, so each distinct endpoint set gets one: external traffic's
// own set when the policies differ, and with both Local the cluster-wide
// set that the node and pods meet at external addresses (kube-proxy's
// shortcut: UsesClusterEndpoints holds for every externally accessible
// port, whatever internalTrafficPolicy says), while external clients and
// the cluster IP share the node-local one.
func (p trafficPolicy) splitExternal() bool {
	return p.hasExternal && (p.internalLocal || p.externalLocal)
}

// bothLocal: both policies Local, the second socket is the shortcut's
// cluster-wide one (splitExternal).
func (p trafficPolicy) bothLocal() bool {
	return p.hasExternal && p.internalLocal && p.externalLocal
}

// internalEndpoints are those for ClusterIP traffic, and for external
// traffic too when the policies agree (under both Local, for external
// clients only).
func (p trafficPolicy) internalEndpoints(eps []loadbalancer.Endpoint, node nodeTopology) []loadbalancer.Endpoint {
	if p.internalLocal {
		return onNode(eps, node.name)
	}
	return topologyFiltered(eps, node)
}

// splitEndpoints are those of the second socket (splitExternal): the
// cluster-wide set when the cluster IP's is node-local
// (internalTrafficPolicy Local: external traffic's under
// externalTrafficPolicy Cluster, the node's and pods' shortcut under
// Local), else external traffic's node-local set (externalTrafficPolicy
// Local): external traffic to a node without a local endpoint is refused,
// never sent elsewhere (which would lose the client IP).
func (p trafficPolicy) splitEndpoints(eps []loadbalancer.Endpoint, node nodeTopology) []loadbalancer.Endpoint {
	if p.internalLocal {
		return topologyFiltered(eps, node)
	}
	return onNode(eps, node.name)
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

// addReadyLocalIPs adds the IPs of eps's ready endpoints on node to ips.
func addReadyLocalIPs(ips map[netip.Addr]bool, eps []loadbalancer.Endpoint, node string) {
	for _, e := range eps {
		if node != "" && e.NodeName == node && e.Ready {
			ips[e.Addr.Addr().Unmap()] = true
		}
	}
}

// localPodCount is what a healthCheckNodePort reports as the node's local
// endpoints, from the distinct IPs of its ready local endpoints over all
// the Service's ports: kube-proxy's LocalReadyEndpoints, which counts IPs
// and not ip:port endpoints (two pods serving one port each are two), in
// its per-family proxiers, each of its own family (a dual-stack pod is one
// in each): by family, IPv4 then IPv6 (localEndpoints picks one).
func localPodCount(ips map[netip.Addr]bool) [2]int {
	var n [2]int
	for a := range ips {
		if a.Is4() {
			n[0]++
		} else {
			n[1]++
		}
	}
	return n
}

// topologyFiltered applies EndpointSlice hints as kube-proxy does, deciding
// per address family (an IPv4-mapped address counts as IPv4), as
// kube-proxy's per-family proxiers each categorize their own family's
// endpoints: one family's missing hints do not switch hints off for the
// other, and one family's hinted endpoints do not decide the other's set.
// Each family keeps what topologyKeep decides for it, in the order given.
func topologyFiltered(eps []loadbalancer.Endpoint, node nodeTopology) []loadbalancer.Endpoint {
	var keep [2]func(loadbalancer.Endpoint) bool // by family: IPv4, IPv6; nil keeps all
	for f := range keep {
		keep[f] = topologyKeep(eps, f, node)
	}
	if keep[0] == nil && keep[1] == nil {
		return eps
	}
	out := []loadbalancer.Endpoint{}
	for _, e := range eps {
		if k := keep[loadbalancer.Family(e.Addr)]; k == nil || e.Ready && k(e) {
			out = append(out, e)
		}
	}
	return out
}

// topologyKeep decides the hints of family f's endpoints among eps, by
// kube-proxy's rule (topologyModeFromHints): node hints when every ready
// endpoint of the family carries node hints and one of them is for this
// node, else zone hints when every ready endpoint carries zone hints and
// one of them is for this node's zone; partial hints mean the controller
// is mid-update, so all endpoints are used. Node hints count whatever the
// Service's trafficDistribution says, as kube-proxy's (the EndpointSlice
// controller writes them for PreferSameNode). Only ready endpoints count: a
// non-ready one hinted for this zone must not switch hints on, or a node
// whose zone has no ready endpoint would reset every connection. It returns
// which ready endpoints of the family are kept (the hinted ones), or nil
// when hints are off and the family keeps all its endpoints.
func topologyKeep(eps []loadbalancer.Endpoint, f int, node nodeTopology) func(loadbalancer.Endpoint) bool {
	ready := false
	allNodeHints, allZoneHints := true, true
	forNode, forZone := false, false
	for _, e := range eps {
		if loadbalancer.Family(e.Addr) != f || !e.Ready {
			continue
		}
		ready = true
		if len(e.NodeHints) == 0 {
			allNodeHints = false
		} else if node.name != "" && slices.Contains(e.NodeHints, node.name) {
			forNode = true
		}
		if len(e.ZoneHints) == 0 {
			allZoneHints = false
		} else if node.zone != "" && slices.Contains(e.ZoneHints, node.zone) {
			forZone = true
		}
	}
	switch {
	case !ready:
		return nil
	case allNodeHints && forNode:
		return func(e loadbalancer.Endpoint) bool { return slices.Contains(e.NodeHints, node.name) }
	case allZoneHints && forZone:
		return func(e loadbalancer.Endpoint) bool { return slices.Contains(e.ZoneHints, node.zone) }
	}
	return nil
}

// externalName is the balancer entry of a service port's external traffic
// when it differs from its internal traffic. The suffix cannot clash with a
// real port name: those are DNS labels, without '@'.
func externalName(spn loadbalancer.ServicePortName) loadbalancer.ServicePortName {
	spn.Port += "@external"
	return spn
}
