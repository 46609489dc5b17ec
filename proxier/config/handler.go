// Package config delivers Service and EndpointSlice events to the proxier from
// a source: a directory of manifests, or an API server through informers. The
// handler interfaces are kube-proxy's, so the proxier does not know which
// source feeds it.
//
// It also owns what stands between a source and the proxier or feeds the
// rest of the command: this node's Node object (NodeHandler, ReadNode), the
// last known state that serves a restart through an API-server outage
// (LastKnownState and the --state-file format), the API server's
// validation that manifests and the state file are held to, what else the
// API server would do for manifests (allocate the clusterIPs they leave
// out, refuse a second Service on a clusterIP or node port), and the
// reading of addresses and annotations from objects (ParseObjectIP,
// ParseConnectionLifetime).
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

// Batcher is a Handler that takes a burst of events better as one. A source
// calls BeginBatch before it delivers many events at once (a manifest
// reload, an informer's initial list) and EndBatch after the last of them;
// between the two the handler may defer what each EndpointSlice event
// changes until EndBatch, which returns once it is all served. Delivered
// one by one, the N slices of one Service were each merged with all the
// others (N=5,000 one-endpoint slices: 19 s of CPU). Batches nest, and
// two sources' overlap (the last known state's inside an informer's
// initial list): each EndBatch serves what the batches open deferred so
// far, and those still open defer on. Calls are serialised with the
// events as the source serialises those.
type Batcher interface {
	BeginBatch()
	EndBatch()
}

// beginBatch opens a batch of h's events when h takes them (Batcher).
func beginBatch(h any) {
	if b, ok := h.(Batcher); ok {
		b.BeginBatch()
	}
}

// endBatch ends a batch beginBatch opened.
func endBatch(h any) {
	if b, ok := h.(Batcher); ok {
		b.EndBatch()
	}
}
