package proxier

import (
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// servicePortInfo is what the proxier needs of one Service port: the inputs
// of its proxy socket, its portal rules and its balancer affinity policy.
type servicePortInfo struct {
	name            loadbalancer.ServicePortName
	key             string // name.String(), the portal rules' comment
	port            int
	clusterIPs      []netip.Addr
	externalIPs     []netip.Addr
	loadBalancerIPs []netip.Addr
	// sourceRanges are the Service's loadBalancerSourceRanges: only these
	// sources reach its LoadBalancer IPs (iptables.Portal.SourceRanges).
	sourceRanges []netip.Prefix
	nodePort     int
	affinity     loadbalancer.AffinityPolicy
	// dualStack: ClusterIPs of both families, so each family's clients
	// are served by that family's endpoints only (SetFamiliesApart).
	dualStack bool
	policy    trafficPolicy
	// healthCheckNodePort is served for externalTrafficPolicy Local.
	healthCheckNodePort int
	// faultName is the port's name in the fault API; toxics are those its
	// Service declares, unless faultsErr says the annotation is invalid.
	faultName string
	toxics    []faults.Toxic
	faultsErr error
	// faultsAnnotation is the annotation's value toxics were parsed from,
	// which syncFaults compares with the Service's latest.
	faultsAnnotation string
	// lifetime is what the Service's connection lifetime annotations
	// ask for, unless lifetimeErr says they are invalid.
	lifetime    config.ConnectionLifetime
	lifetimeErr error
}

// sameRules reports whether a and b yield the same portal rules. The socket
// itself depends only on the protocol, which is part of the name. The
// accept of a healthCheckNodePort is left out: no socket, flow or claim
// depends on it (syncPortals renders it from the current info).
func (a *servicePortInfo) sameRules(b *servicePortInfo) bool {
	return a.port == b.port && a.nodePort == b.nodePort && a.policy == b.policy &&
		slices.Equal(a.clusterIPs, b.clusterIPs) &&
		slices.Equal(a.externalIPs, b.externalIPs) &&
		slices.Equal(a.loadBalancerIPs, b.loadBalancerIPs) &&
		slices.Equal(a.sourceRanges, b.sourceRanges)
}

// servicePorts converts a Service into its proxied ports. ExternalName and
// headless Services have none: there is nothing to proxy.
func servicePorts(svc *v1.Service) []*servicePortInfo {
	// Headless whatever else it lists (externalIPs, which the API server
	// accepts with a warning that they are ignored): kube-proxy's
	// ShouldSkipService, and the API-server source's informerSkipsService.
	if svc.Spec.Type == v1.ServiceTypeExternalName || svc.Spec.ClusterIP == v1.ClusterIPNone {
		return nil
	}
	clusterIPs := parseIPs(svc.Spec.ClusterIPs)
	if len(clusterIPs) == 0 {
		clusterIPs = parseIPs([]string{svc.Spec.ClusterIP})
	}
	if len(clusterIPs) == 0 && svc.Spec.Type == v1.ServiceTypeClusterIP && len(svc.Spec.ExternalIPs) == 0 {
		return nil // headless or not yet allocated
	}
	if len(clusterIPs) > 0 {
		if clusterIPs = usable(clusterIPs); len(clusterIPs) == 0 {
			return nil // every ClusterIP unusable (logged by the source)
		}
	}
	externalIPs := parseIPs(svc.Spec.ExternalIPs)
	var lbIPs []netip.Addr
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP {
			// Proxy: the load balancer terminates the traffic (PROXY
			// protocol, TLS): kube-proxy installs no portal for it, so pods
			// reach the real LB. Only VIP (or no ipMode) gets a portal, as
			// kube-proxy's IsVIPMode: a mode it does not know is not VIP.
			continue
		}
		if a, ok := config.ParseObjectIP(ing.IP); ok && config.UnusableServiceIP(a) == "" {
			lbIPs = append(lbIPs, a)
		}
	}
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	externalIPs = inFamiliesOf(clusterIPs, externalIPs, nn, "spec.externalIPs")
	lbIPs = inFamiliesOf(clusterIPs, lbIPs, nn, "status.loadBalancer.ingress")
	var sourceRanges []netip.Prefix
	if svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		lbIPs = nil
	} else {
		sourceRanges = parseSourceRanges(svc.Spec.LoadBalancerSourceRanges)
	}
	affinity := loadbalancer.AffinityPolicy{}
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		affinity.ClientIP = true
		affinity.Timeout = loadbalancer.DefaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			affinity.Timeout = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	// Whether a port is reachable from outside is its own, as kube-proxy's
	// ExternallyAccessible: a nodePort of its own, or the Service's
	// externalIPs or VIP LB IPs. Decided per Service, a LoadBalancer
	// without allocated NodePorts whose ingress was pending gave a port
	// without a nodePort an external socket no rule led to, because
	// another of its ports named one.
	external := len(externalIPs) > 0 || len(lbIPs) > 0
	hasNodePorts := svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer
	toxics, faultsErr := faults.ForService(svc)
	lifetime, lifetimeErr := config.ParseConnectionLifetime(svc)
	var out []*servicePortInfo
	for _, p := range svc.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = v1.ProtocolTCP
		}
		if proto != v1.ProtocolTCP && proto != v1.ProtocolUDP {
			continue // SCTP: no userspace socket for it; sources report it
		}
		name := loadbalancer.ServicePortName{NamespacedName: nn, Port: p.Name, Protocol: proto}
		nodePort := 0
		if hasNodePorts {
			nodePort = int(p.NodePort)
		}
		policy := policyOf(svc, external || nodePort != 0)
		info := &servicePortInfo{
			name:             name,
			key:              name.String(),
			port:             int(p.Port),
			clusterIPs:       clusterIPs,
			externalIPs:      externalIPs,
			loadBalancerIPs:  lbIPs,
			sourceRanges:     sourceRanges,
			affinity:         affinity,
			dualStack:        slices.ContainsFunc(clusterIPs, netip.Addr.Is4) && slices.ContainsFunc(clusterIPs, netip.Addr.Is6),
			policy:           policy,
			nodePort:         nodePort,
			faultName:        faults.ProxyName(svc.Namespace, svc.Name, p.Name, int(p.Port)),
			toxics:           toxics[p.Name],
			faultsErr:        faultsErr,
			faultsAnnotation: svc.Annotations[faults.Annotation],
			lifetime:         lifetime,
			lifetimeErr:      lifetimeErr,
		}
		if policy.externalLocal && svc.Spec.Type == v1.ServiceTypeLoadBalancer {
			info.healthCheckNodePort = int(svc.Spec.HealthCheckNodePort)
		}
		out = append(out, info)
	}
	return out
}

// inFamiliesOf keeps the addresses of the families of clusterIPs, as
// kube-proxy's proxier of each family serves a Service only in the families
// of its spec.clusterIPs, with its addresses of that family: an IPv4-only
// Service's IPv6 externalIP or LoadBalancer IP gets no portal. Without
// ClusterIPs every address is kept.
func inFamiliesOf(clusterIPs, ips []netip.Addr, nn types.NamespacedName, field string) []netip.Addr {
	var v4, v6 bool
	for _, c := range clusterIPs {
		v4, v6 = v4 || c.Is4(), v6 || c.Is6()
	}
	other := func(ip netip.Addr) bool { return len(clusterIPs) > 0 && (ip.Is6() && !v6 || ip.Is4() && !v4) }
	if !slices.ContainsFunc(ips, other) {
		return ips // the usual case: nothing to drop, nothing copied
	}
	var kept []netip.Addr
	for _, ip := range ips {
		if !other(ip) {
			kept = append(kept, ip)
			continue
		}
		klog.V(2).InfoS("Ignoring a Service address of an IP family the Service does not have (spec.ipFamilies): no portal for it",
			"service", nn, "field", field, "address", ip)
	}
	return kept
}

// usable leaves out the ClusterIPs config.UnusableServiceIP refuses
// (loopback, link-local, unspecified): a portal for one captured the
// node's own traffic. The API server allocates ClusterIPs from its range,
// so usually nothing is left out (nor copied). (ExternalIPs are not
// checked here: the API server and the manifests source refuse such.)
func usable(ips []netip.Addr) []netip.Addr {
	unusable := func(a netip.Addr) bool { return config.UnusableServiceIP(a) != "" }
	if !slices.ContainsFunc(ips, unusable) {
		return ips
	}
	return slices.DeleteFunc(slices.Clone(ips), unusable)
}

// parseIPs reads a Service's addresses as kube-proxy does
// (config.ParseObjectIP: leading zeros an older API server stored are
// read as decimal). The API server and the manifests source refuse an
// invalid one, so one here is left out.
func parseIPs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, ok := config.ParseObjectIP(s); ok {
			out = append(out, a)
		}
	}
	return out
}

// parseSourceRanges reads loadBalancerSourceRanges as kube-proxy does:
// spaces around an entry are trimmed, leading zeros read as decimal
// (config.ParseObjectPrefix). The API server and the manifests source
// refuse an invalid entry, so one here is left out.
func parseSourceRanges(ss []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		if p, ok := config.ParseObjectPrefix(s); ok {
			out = append(out, p)
		}
	}
	return out
}

func addrStrings(as []netip.Addr) []string {
	out := make([]string, 0, len(as))
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}

// hasIPv6 reports whether any service address of the port is IPv6, so its
// proxy socket must accept IPv6.
func (a *servicePortInfo) hasIPv6() bool {
	for _, group := range [][]netip.Addr{a.clusterIPs, a.externalIPs, a.loadBalancerIPs} {
		for _, ip := range group {
			if ip.Is6() {
				return true
			}
		}
	}
	return false
}
