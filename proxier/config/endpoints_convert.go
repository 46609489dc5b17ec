package config

//lint:file-ignore SA1019 v1.Endpoints is read on purpose: manifests may hold them, and they are converted to EndpointSlices

import (
	"fmt"
	"maps"

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
// (named "<name>-subset<i>-ipv4|ipv6"), with the Endpoints' labels and
// annotations (mirroredMetadata); NotReadyAddresses become endpoints with
// ready=false. An Endpoints
// labelled endpointslice.kubernetes.io/skip-mirror=true, or holding a
// leader-election record, gives none: the controller does not mirror it,
// so kube-proxy never serves it.
func EndpointsToSlices(e *v1.Endpoints) []*discovery.EndpointSlice {
	if e.Labels[discovery.LabelSkipMirror] == "true" {
		return nil
	}
	if _, lock := e.Annotations[leaderElectionAnnotation]; lock {
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
				TypeMeta:    metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: KindEndpointSlice},
				ObjectMeta:  mirroredMetadata(e, sliceNameForSubset(e.Name, i, family)),
				AddressType: family,
				Endpoints:   eps,
				Ports:       slicePorts(ss.Ports),
			})
		}
	}
	return out
}

// mirroredMetadata is a slice's metadata as the mirroring controller
// writes it: every label of the Endpoints (so that ProxyLabelSelector
// leaves out the slices of one labelled for another proxy or headless, as
// kube-proxy's informers do) but the service-name and managed-by labels,
// which it sets; every annotation but the trigger time and kubectl's
// last-applied configuration.
func mirroredMetadata(e *v1.Endpoints, name string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Name: name, Namespace: e.Namespace, Labels: maps.Clone(e.Labels)}
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	m.Labels[discovery.LabelServiceName] = e.Name
	m.Labels[discovery.LabelManagedBy] = ManagedByManifests
	for k, v := range e.Annotations {
		if k == v1.EndpointsLastChangeTriggerTime || k == v1.LastAppliedConfigAnnotation {
			continue
		}
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[k] = v
	}
	return m
}

// leaderElectionAnnotation marks an Endpoints used as a leader-election
// lock (client-go's resourcelock.LeaderElectionRecordAnnotationKey, not
// imported for one string).
const leaderElectionAnnotation = "control-plane.alpha.kubernetes.io/leader"

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
		TargetRef: a.TargetRef,
	}
	// An empty nodeName, which validateEndpointAddress lets through (the
	// API server refuses it, as any name that is not a DNS subdomain),
	// would make an invalid slice: it is left out.
	if a.NodeName != nil && *a.NodeName != "" {
		ep.NodeName = a.NodeName
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
