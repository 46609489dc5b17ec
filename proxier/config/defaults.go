package config

//lint:file-ignore SA1019 v1.Endpoints is read on purpose: manifests may hold them, and they are converted to EndpointSlices

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// defaultAffinityTimeoutSeconds is Kubernetes' default for
// sessionAffinityConfig.clientIP.timeoutSeconds.
const defaultAffinityTimeoutSeconds = 10800

// setDefaults fills in what the API server would have filled in, so that the
// proxier sees the same objects whether they came from files or informers.
func setDefaults(obj runtime.Object) {
	switch o := obj.(type) {
	case *v1.Service:
		defaultService(o)
	case *discovery.EndpointSlice:
		defaultEndpointSlice(o)
	case *v1.Endpoints:
		defaultEndpoints(o)
	}
}

func defaultNamespace(ns *string) {
	if *ns == "" {
		*ns = v1.NamespaceDefault
	}
}

func defaultService(s *v1.Service) {
	defaultNamespace(&s.Namespace)
	if s.Spec.Type == "" {
		s.Spec.Type = v1.ServiceTypeClusterIP
	}
	if s.Spec.SessionAffinity == "" {
		s.Spec.SessionAffinity = v1.ServiceAffinityNone
	}
	if s.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		if s.Spec.SessionAffinityConfig == nil {
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{}
		}
		if s.Spec.SessionAffinityConfig.ClientIP == nil {
			s.Spec.SessionAffinityConfig.ClientIP = &v1.ClientIPConfig{}
		}
		if s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds == nil {
			s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = ptr.To[int32](defaultAffinityTimeoutSeconds)
		}
	}
	if s.Spec.ClusterIP != "" && len(s.Spec.ClusterIPs) == 0 {
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	}
	if s.Spec.ClusterIP == "" && len(s.Spec.ClusterIPs) > 0 {
		s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	}
	for i := range s.Spec.Ports {
		p := &s.Spec.Ports[i]
		if p.Protocol == "" {
			p.Protocol = v1.ProtocolTCP
		}
		if p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal == 0 {
			p.TargetPort = intstr.FromInt32(p.Port)
		}
	}
	if (s.Spec.Type == v1.ServiceTypeNodePort || s.Spec.Type == v1.ServiceTypeLoadBalancer) && s.Spec.ExternalTrafficPolicy == "" {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	}
	if s.Spec.Type != v1.ServiceTypeExternalName && s.Spec.InternalTrafficPolicy == nil {
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyCluster)
	}
}

func defaultEndpointSlice(es *discovery.EndpointSlice) {
	defaultNamespace(&es.Namespace)
	for i := range es.Ports {
		if es.Ports[i].Protocol == nil {
			es.Ports[i].Protocol = ptr.To(v1.ProtocolTCP)
		}
		if es.Ports[i].Name == nil {
			es.Ports[i].Name = ptr.To("")
		}
	}
	for i := range es.Endpoints {
		c := &es.Endpoints[i].Conditions
		// An absent condition means "unknown"; the API says to read an
		// unknown ready and serving as true, as kube-proxy does (serving
		// is not ready's copy: a terminating endpoint that still serves is
		// the fallback when none is ready).
		if c.Ready == nil {
			c.Ready = ptr.To(true)
		}
		if c.Serving == nil {
			c.Serving = ptr.To(true)
		}
		if c.Terminating == nil {
			c.Terminating = ptr.To(false)
		}
	}
}

func defaultEndpoints(e *v1.Endpoints) {
	defaultNamespace(&e.Namespace)
	for i := range e.Subsets {
		for j := range e.Subsets[i].Ports {
			if e.Subsets[i].Ports[j].Protocol == "" {
				e.Subsets[i].Ports[j].Protocol = v1.ProtocolTCP
			}
		}
	}
}
