package config

//lint:file-ignore SA1019 v1.Endpoints is read on purpose: manifests may hold them, and they are converted to EndpointSlices

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ManagedByManifests is the endpointslice.kubernetes.io/managed-by value of
// slices converted from v1 Endpoints manifests.
const ManagedByManifests = "manifests.kube-userspace-proxy"

// EndpointsToSlices converts a validated v1 Endpoints into EndpointSlices the
// way the mirroring controller would: one slice per subset and address family
// (named "<name>-subset<i>-ipv4|ipv6"), labelled with the Service name;
// NotReadyAddresses become endpoints with ready=false. An Endpoints
// labelled endpointslice.kubernetes.io/skip-mirror=true gives none: the
// controller does not mirror it, so kube-proxy never serves it.
func EndpointsToSlices(e *v1.Endpoints) []*discovery.EndpointSlice {
	if e.Labels[discovery.LabelSkipMirror] == "true" {
		return nil
	}
	var out []*discovery.EndpointSlice
	for i, ss := range e.Subsets {
		for _, family := range []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv6} {
			var eps []discovery.Endpoint
			for _, a := range ss.Addresses {
				if addressFamily(a.IP) == family {
					eps = append(eps, endpointFromAddress(a, true))
				}
			}
			for _, a := range ss.NotReadyAddresses {
				if addressFamily(a.IP) == family {
					eps = append(eps, endpointFromAddress(a, false))
				}
			}
			if len(eps) == 0 {
				continue
			}
			out = append(out, &discovery.EndpointSlice{
				TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: KindEndpointSlice},
				ObjectMeta: metav1.ObjectMeta{
					Name:      sliceNameForSubset(e.Name, i, family),
					Namespace: e.Namespace,
					Labels: map[string]string{
						discovery.LabelServiceName: e.Name,
						discovery.LabelManagedBy:   ManagedByManifests,
					},
				},
				AddressType: family,
				Endpoints:   eps,
				Ports:       slicePorts(ss.Ports),
			})
		}
	}
	return out
}

func sliceNameForSubset(name string, subset int, family discovery.AddressType) string {
	suffix := "ipv4"
	if family == discovery.AddressTypeIPv6 {
		suffix = "ipv6"
	}
	return fmt.Sprintf("%s-subset%d-%s", name, subset, suffix)
}

// addressFamily of a validated IP.
func addressFamily(ip string) discovery.AddressType {
	if a, ok := parseIP(ip); ok && a.Is4() {
		return discovery.AddressTypeIPv4
	}
	return discovery.AddressTypeIPv6
}

func endpointFromAddress(a v1.EndpointAddress, ready bool) discovery.Endpoint {
	ep := discovery.Endpoint{
		Addresses: []string{a.IP},
		Conditions: discovery.EndpointConditions{
			Ready:       ptr.To(ready),
			Serving:     ptr.To(ready),
			Terminating: ptr.To(false),
		},
		NodeName:  a.NodeName,
		TargetRef: a.TargetRef,
	}
	if a.Hostname != "" {
		ep.Hostname = ptr.To(a.Hostname)
	}
	return ep
}

func slicePorts(ports []v1.EndpointPort) []discovery.EndpointPort {
	out := make([]discovery.EndpointPort, 0, len(ports))
	for _, p := range ports {
		out = append(out, discovery.EndpointPort{
			Name:        ptr.To(p.Name),
			Port:        ptr.To(p.Port),
			Protocol:    ptr.To(p.Protocol),
			AppProtocol: p.AppProtocol,
		})
	}
	return out
}
