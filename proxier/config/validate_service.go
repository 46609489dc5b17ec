package config

import (
	"errors"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

func validateService(fe *fieldErrors, s *v1.Service, nodePorts PortRange) {
	validateMeta(fe, s.Name, s.Namespace, validation.IsDNS1035Label)
	spec := field.NewPath("spec")

	switch s.Spec.Type {
	case v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer:
	case v1.ServiceTypeExternalName:
		if s.Spec.ExternalName == "" {
			fe.add(spec.Child("externalName"), "is required for type ExternalName")
		}
		return // the proxy does not serve ExternalName Services; nothing else matters
	default:
		fe.add(spec.Child("type"), "%q is not a valid type (ClusterIP, NodePort, LoadBalancer, ExternalName)", s.Spec.Type)
		return
	}

	headless := s.Spec.ClusterIP == v1.ClusterIPNone
	validateClusterIPs(fe, spec, s)
	validateIPFamilies(fe, spec, s)
	if len(s.Spec.Ports) == 0 && !headless {
		fe.add(spec.Child("ports"), "at least one port is required")
	}
	validateServicePorts(fe, spec.Child("ports"), s, nodePorts)

	for i, ip := range s.Spec.ExternalIPs {
		path := spec.Child("externalIPs").Index(i)
		if a, ok := validateUnmappedIP(fe, path, ip); ok {
			validateNonSpecialIP(fe, path, a, ip)
		}
	}
	for i, ing := range s.Status.LoadBalancer.Ingress {
		path := field.NewPath("status", "loadBalancer", "ingress").Index(i)
		if ing.IP != "" {
			if a, ok := validateUnmappedIP(fe, path.Child("ip"), ing.IP); ok {
				validateNonSpecialIP(fe, path.Child("ip"), a, ing.IP)
			}
		} else if ing.Hostname == "" {
			fe.add(path, "needs an ip or a hostname")
		}
		// As the API server: an ipMode is VIP or Proxy, and only with an ip.
		// The proxier gives a portal to VIP (or no ipMode) alone, so a
		// misspelt VIP lost the LB IP's portal without a word.
		switch m := ing.IPMode; {
		case m == nil:
		case ing.IP == "":
			fe.add(path.Child("ipMode"), "may only be set with an ip")
		case *m != v1.LoadBalancerIPModeVIP && *m != v1.LoadBalancerIPModeProxy:
			fe.add(path.Child("ipMode"), "%q is not valid (VIP or Proxy)", *m)
		}
	}
	validateHealthCheckNodePort(fe, spec.Child("healthCheckNodePort"), s, nodePorts)
	validateSourceRanges(fe, spec.Child("loadBalancerSourceRanges"), s)
	validateAffinity(fe, spec, s)
	if _, err := faults.ForService(s); err != nil {
		fe.add(field.NewPath("metadata", "annotations").Key(faults.Annotation), "%v", err)
	}
	if _, err := ParseConnectionLifetime(s); err != nil {
		var le *LifetimeError
		if errors.As(err, &le) {
			fe.add(field.NewPath("metadata", "annotations").Key(le.Key), "%s", le.Msg)
		}
	}
	switch etp := s.Spec.ExternalTrafficPolicy; {
	case etp != "" && etp != v1.ServiceExternalTrafficPolicyCluster && etp != v1.ServiceExternalTrafficPolicyLocal:
		fe.add(spec.Child("externalTrafficPolicy"), "%q is not valid (Cluster or Local)", etp)
	case etp != "" && !externallyAccessible(s):
		// As the API server (validateServiceExternalTrafficPolicy): such
		// a Service has no external traffic, and the policy did nothing
		// (kube-proxy's ExternalPolicyLocal is false there), where its
		// author may have meant internalTrafficPolicy.
		hint := ""
		if etp == v1.ServiceExternalTrafficPolicyLocal {
			hint = " (internalTrafficPolicy: Local keeps cluster IP traffic on the node)"
		}
		fe.add(spec.Child("externalTrafficPolicy"), "%q may only be set for externally-accessible Services (type NodePort or LoadBalancer, or with externalIPs), as the API server refuses it%s", etp, hint)
	}
	if p := s.Spec.InternalTrafficPolicy; p != nil && *p != v1.ServiceInternalTrafficPolicyCluster && *p != v1.ServiceInternalTrafficPolicyLocal {
		fe.add(spec.Child("internalTrafficPolicy"), "%q is not valid (Cluster or Local)", *p)
	}
	// As the API server: a misspelt value (the field is only read by the
	// EndpointSlice controller, which writes the hints the proxy follows)
	// would otherwise pass as if topology were asked for.
	switch d := s.Spec.TrafficDistribution; {
	case d == nil, *d == v1.ServiceTrafficDistributionPreferClose,
		*d == v1.ServiceTrafficDistributionPreferSameZone, *d == v1.ServiceTrafficDistributionPreferSameNode:
	default:
		fe.add(spec.Child("trafficDistribution"), "%q is not valid (PreferClose, PreferSameZone or PreferSameNode)", *d)
	}
}

// externallyAccessible is the API server's ExternallyAccessible: a Service
// with traffic from outside (a NodePort, a LoadBalancer, or externalIPs).
func externallyAccessible(s *v1.Service) bool {
	switch s.Spec.Type {
	case v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer:
		return true
	case v1.ServiceTypeClusterIP:
		return len(s.Spec.ExternalIPs) > 0
	}
	return false
}

// validateNonSpecialIP refuses the addresses UnusableServiceIP names: the
// proxier would otherwise render a rule that takes over such an address on
// every node.
func validateNonSpecialIP(fe *fieldErrors, path *field.Path, a netip.Addr, s string) {
	if why := UnusableServiceIP(a); why != "" {
		fe.add(path, "%q %s", s, why)
	}
}

// validateHealthCheckNodePort refuses a healthCheckNodePort outside the
// node port range, or one of the Service's own node ports, as the API
// server's allocator would: the proxy opens it in a drop-policy node's
// firewall to every host (port 22 as well), and the health server and the
// node port's claim cannot both hold it. As the API server
// (validateServiceExternalTrafficPolicy), only a LoadBalancer with
// externalTrafficPolicy Local may have one: on any other Service nothing
// serves it (kube-proxy's NeedsHealthCheck), and it was taken without a
// word while its port was held from every other Service.
func validateHealthCheckNodePort(fe *fieldErrors, path *field.Path, s *v1.Service, r PortRange) {
	port := s.Spec.HealthCheckNodePort
	if port == 0 {
		return
	}
	if s.Spec.Type != v1.ServiceTypeLoadBalancer || s.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal {
		fe.add(path, "may only be set when type is LoadBalancer and externalTrafficPolicy is Local, as the API server refuses it (no health check is served for any other Service)")
		return
	}
	if !r.contains(port) {
		fe.add(path, "%d is out of the node port range %s", port, r)
		return
	}
	for i, p := range s.Spec.Ports {
		if p.NodePort == port {
			fe.add(path, "%d is also spec.ports[%d].nodePort", port, i)
			return
		}
	}
}

// validateSourceRanges checks loadBalancerSourceRanges as the API server
// does: CIDRs (spaces around one are allowed), and only on a LoadBalancer.
func validateSourceRanges(fe *fieldErrors, path *field.Path, s *v1.Service) {
	if len(s.Spec.LoadBalancerSourceRanges) == 0 {
		return
	}
	if s.Spec.Type != v1.ServiceTypeLoadBalancer {
		fe.add(path, "may only be used when type is LoadBalancer")
		return
	}
	for i, r := range s.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		sloppy, sloppyOK := ParseObjectPrefix(r)
		switch {
		case err != nil && sloppyOK:
			// As validateIP: an older API server stored it.
			fe.addStrict(path.Index(i), "%q has leading zeros (write %s)", r, sloppy)
		case err != nil:
			fe.add(path.Index(i), "%q is not a valid IP range (CIDR, such as 10.240.0.0/24)", r)
		case p.Addr().Is4In6():
			// Refused by the API server as a mapped address is.
			if p.Bits() >= 96 {
				fe.addStrict(path.Index(i), "%q is an IPv4-mapped IPv6 range (write %s)", r, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96))
			} else {
				fe.addStrict(path.Index(i), "%q is an IPv4-mapped IPv6 range", r)
			}
		}
	}
}

// validateClusterIPs checks clusterIP/clusterIPs after defaulting made them
// agree on the first entry: "None" (headless) or at most one IP per family.
func validateClusterIPs(fe *fieldErrors, spec *field.Path, s *v1.Service) {
	if s.Spec.ClusterIP == "" {
		return
	}
	if len(s.Spec.ClusterIPs) > 0 && s.Spec.ClusterIPs[0] != s.Spec.ClusterIP {
		fe.add(spec.Child("clusterIPs").Index(0), "%q must equal spec.clusterIP %q", s.Spec.ClusterIPs[0], s.Spec.ClusterIP)
		return
	}
	if s.Spec.ClusterIP == v1.ClusterIPNone {
		if len(s.Spec.ClusterIPs) > 1 {
			fe.add(spec.Child("clusterIPs"), "must hold only \"None\" for a headless Service")
		}
		// The API server refuses these; served, a NodePort headless
		// Service took its node port on every node.
		if t := s.Spec.Type; t == v1.ServiceTypeNodePort || t == v1.ServiceTypeLoadBalancer {
			fe.add(spec.Child("clusterIP"), "%q may not be set for a %s Service", v1.ClusterIPNone, t)
		}
		return
	}
	if len(s.Spec.ClusterIPs) > 2 {
		fe.add(spec.Child("clusterIPs"), "at most two addresses (one per IP family)")
	}
	var seen4, seen6 bool
	for i, ip := range s.Spec.ClusterIPs {
		path := spec.Child("clusterIPs").Index(i)
		if i == 0 {
			path = spec.Child("clusterIP")
		}
		a, ok := validateIP(fe, path, ip)
		if !ok {
			continue
		}
		if a.Is4In6() {
			// The API server refuses it (strict IP validation): served, it
			// was IPv4 to the proxy and IPv6 to whatever else reads it.
			fe.add(path, "%q is an IPv4-mapped IPv6 address (write %s)", ip, a.Unmap())
			continue
		}
		validateNonSpecialIP(fe, path, a, ip)
		seen := &seen4
		if a.Is6() {
			seen = &seen6
		}
		if *seen {
			fe.add(path, "%q is a second address of the same IP family", ip)
		}
		*seen = true
	}
}

// validateIPFamilies checks spec.ipFamilyPolicy and spec.ipFamilies, and
// that they agree with the clusterIPs, as the API server does: a Service
// whose fields disagreed was served in its addresses' families, whatever
// it stated (SingleStack with two clusterIPs, dual-stack).
func validateIPFamilies(fe *fieldErrors, spec *field.Path, s *v1.Service) {
	if p := s.Spec.IPFamilyPolicy; p != nil {
		path := spec.Child("ipFamilyPolicy")
		switch *p {
		case v1.IPFamilyPolicySingleStack:
			if len(s.Spec.ClusterIPs) == 2 {
				fe.add(path, "SingleStack, but spec.clusterIPs holds two addresses (RequireDualStack or PreferDualStack serves both)")
			}
			if len(s.Spec.IPFamilies) == 2 {
				fe.add(path, "SingleStack, but spec.ipFamilies lists two (RequireDualStack or PreferDualStack serves both)")
			}
		case v1.IPFamilyPolicyPreferDualStack, v1.IPFamilyPolicyRequireDualStack:
		default:
			fe.add(path, "%q is not a valid policy (SingleStack, PreferDualStack or RequireDualStack)", *p)
		}
	}
	if len(s.Spec.IPFamilies) > 2 {
		fe.add(spec.Child("ipFamilies"), "at most two (one per IP family)")
	}
	for i, fam := range s.Spec.IPFamilies {
		path := spec.Child("ipFamilies").Index(i)
		if fam != v1.IPv4Protocol && fam != v1.IPv6Protocol {
			fe.add(path, "%q is not a valid IP family (IPv4 or IPv6)", fam)
			continue
		}
		if slices.Contains(s.Spec.IPFamilies[:i], fam) {
			fe.add(path, "%q is listed twice", fam)
		}
		if i >= len(s.Spec.ClusterIPs) || s.Spec.ClusterIP == v1.ClusterIPNone {
			continue
		}
		if a, ok := parseIP(s.Spec.ClusterIPs[i]); ok && !a.Is4In6() && a.Is4() != (fam == v1.IPv4Protocol) {
			ipPath := spec.Child("clusterIPs").Index(i)
			if i == 0 {
				ipPath = spec.Child("clusterIP")
			}
			fe.add(ipPath, "%q is not an %s address, as spec.ipFamilies[%d] says", s.Spec.ClusterIPs[i], fam, i)
		}
	}
}

// validateServicePorts checks each port, and as the API server that no
// port number nor node port is listed twice for one protocol (the same
// node port for TCP and UDP is allowed).
func validateServicePorts(fe *fieldErrors, path *field.Path, s *v1.Service, nodePorts PortRange) {
	names := newPortNames("Service", len(s.Spec.Ports))
	type portProto struct {
		port  int32
		proto v1.Protocol
	}
	seen, seenNode := map[portProto]bool{}, map[portProto]bool{}
	for i, p := range s.Spec.Ports {
		pp := path.Index(i)
		names.check(fe, pp.Child("name"), p.Name)
		validatePortNumber(fe, pp.Child("port"), p.Port)
		validateProtocol(fe, pp.Child("protocol"), p.Protocol)
		if seen[portProto{p.Port, p.Protocol}] {
			fe.add(pp, "port %d/%s is listed twice", p.Port, p.Protocol)
		}
		seen[portProto{p.Port, p.Protocol}] = true
		if p.TargetPort.Type == intstr.String {
			dnsCheck(fe, pp.Child("targetPort"), p.TargetPort.StrVal, validation.IsValidPortName)
		} else {
			validatePortNumber(fe, pp.Child("targetPort"), p.TargetPort.IntVal)
		}
		validateNodePort(fe, pp.Child("nodePort"), s.Spec.Type, p.NodePort, nodePorts)
		if p.NodePort != 0 {
			if seenNode[portProto{p.NodePort, p.Protocol}] {
				fe.add(pp.Child("nodePort"), "node port %d/%s is listed twice", p.NodePort, p.Protocol)
			}
			seenNode[portProto{p.NodePort, p.Protocol}] = true
		}
	}
}

// validateNodePort: with no API server to allocate one, a NodePort Service
// must name its node ports; a LoadBalancer may go without.
func validateNodePort(fe *fieldErrors, path *field.Path, t v1.ServiceType, port int32, r PortRange) {
	switch {
	case port == 0 && t == v1.ServiceTypeNodePort:
		fe.add(path, "is required for type NodePort (there is no API server to allocate one)")
	case port == 0:
	case t != v1.ServiceTypeNodePort && t != v1.ServiceTypeLoadBalancer:
		fe.add(path, "may only be set for type NodePort or LoadBalancer, not %s", t)
	case !r.contains(port):
		fe.add(path, "%d is out of the node port range %s", port, r)
	}
}

func validateAffinity(fe *fieldErrors, spec *field.Path, s *v1.Service) {
	switch s.Spec.SessionAffinity {
	case v1.ServiceAffinityClientIP:
		t := s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds // set by defaulting
		if *t < 1 || *t > maxAffinityTimeoutSeconds {
			fe.add(spec.Child("sessionAffinityConfig", "clientIP", "timeoutSeconds"),
				"%d is out of range 1-%d", *t, maxAffinityTimeoutSeconds)
		}
	case v1.ServiceAffinityNone:
		if s.Spec.SessionAffinityConfig != nil {
			fe.add(spec.Child("sessionAffinityConfig"), "must not be set when sessionAffinity is None")
		}
	default:
		fe.add(spec.Child("sessionAffinity"), "%q is not valid (None or ClientIP)", s.Spec.SessionAffinity)
	}
}
