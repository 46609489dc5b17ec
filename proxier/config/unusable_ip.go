package config

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// UnusableServiceIP says why a cannot be an address of a Service, which the
// proxy takes over on every node ("" when it can): the addresses the API
// server refuses as an external IP (its ValidateEndpointIP). A portal for
// one captured the node's own traffic: 127.0.0.1:80 reached the Service
// instead of the node's listener, 169.254.169.254 the Service instead of the
// cloud's metadata server. The manifests source refuses them as clusterIPs,
// externalIPs and LoadBalancer ingress IPs; an API server accepts them as
// ingress IPs (status), so the proxier leaves those out (see
// logUnusableServiceIPs).
func UnusableServiceIP(a netip.Addr) string {
	// net.ParseIP, the API server's, reads ::ffff:127.0.0.1 as IPv4.
	a = a.Unmap()
	switch {
	case a.IsUnspecified():
		return "must not be unspecified"
	case a.IsLoopback():
		return "must not be in the loopback range (127.0.0.0/8, ::1/128)"
	case a.IsLinkLocalUnicast():
		return "must not be in the link-local range (169.254.0.0/16, fe80::/10)"
	case a.IsLinkLocalMulticast():
		// The API server's message says ff02::/10; what it (and this)
		// refuses is link-local scope, ff02::/16 and its flagged ffx2::.
		return "must not be in the link-local multicast range (224.0.0.0/24, ff02::/16)"
	}
	return ""
}

// unusableServiceIPs lists svc's clusterIPs and LoadBalancer ingress IPs
// that UnusableServiceIP refuses, each as "field address: reason".
func unusableServiceIPs(svc *v1.Service) []string {
	var out []string
	check := func(field, s string) {
		if a, ok := ParseObjectIP(s); ok {
			if why := UnusableServiceIP(a); why != "" {
				out = append(out, fmt.Sprintf("%s %s: %s", field, s, why))
			}
		}
	}
	for i, ip := range svc.Spec.ClusterIPs {
		check(fmt.Sprintf("spec.clusterIPs[%d]", i), ip)
	}
	if len(svc.Spec.ClusterIPs) == 0 {
		check("spec.clusterIP", svc.Spec.ClusterIP)
	}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		check(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), ing.IP)
	}
	return out
}

// logUnusableServiceIPs says which of svc's addresses get no portal, when
// a change brings one (old nil: none), not on every resync: as SCTP ports,
// they are skipped, and the Service is served on its other addresses.
func logUnusableServiceIPs(old, svc *v1.Service) {
	ips := unusableServiceIPs(svc)
	if len(ips) == 0 {
		return
	}
	if old != nil {
		had := unusableServiceIPs(old)
		if !slices.ContainsFunc(ips, func(s string) bool { return !slices.Contains(had, s) }) {
			return
		}
	}
	klog.InfoS("Warning: Service addresses that would capture the node's own traffic (loopback, link-local, unspecified) get no portal; a Service left without a ClusterIP is not served",
		"service", klog.KObj(svc), "addresses", ips)
}
