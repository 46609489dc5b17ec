// Package config delivers Service and EndpointSlice events to the proxier from
// a source: a directory of manifests, or an API server through informers. The
// handler interfaces are kube-proxy's, so the proxier does not know which
// source feeds it.
package config

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// ServiceHandler receives Service events. Calls are serialised by the source.
type ServiceHandler interface {
	OnServiceAdd(service *v1.Service)
	OnServiceUpdate(oldService, service *v1.Service)
	OnServiceDelete(service *v1.Service)
	// OnServiceSynced is called once, after the initial set of Services was delivered.
	OnServiceSynced()
}

// EndpointSliceHandler receives EndpointSlice events. Calls are serialised by the source.
type EndpointSliceHandler interface {
	OnEndpointSliceAdd(endpointSlice *discovery.EndpointSlice)
	OnEndpointSliceUpdate(oldEndpointSlice, newEndpointSlice *discovery.EndpointSlice)
	OnEndpointSliceDelete(endpointSlice *discovery.EndpointSlice)
	// OnEndpointSlicesSynced is called once, after the initial set of slices was delivered.
	OnEndpointSlicesSynced()
}

// Handler is everything a source feeds.
type Handler interface {
	ServiceHandler
	EndpointSliceHandler
}
