package config

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// informerSkipsService reports whether kube-proxy ignores a Service: ExternalName
// Services are DNS only, and Services without a cluster IP (headless: "None") have no
// virtual IP to proxy.
func informerSkipsService(svc *v1.Service) bool {
	return svc.Spec.Type == v1.ServiceTypeExternalName ||
		svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == v1.ClusterIPNone
}

// skips reports whether svc is left out: a Service kube-proxy ignores,
// unless the handler asked for those too (Unproxied).
func (s *InformerSource) skips(svc *v1.Service) bool {
	return !s.opts.Unproxied && informerSkipsService(svc)
}

// fromInformer returns obj as a *T, unwrapping the tombstone an informer hands to
// OnDelete when it missed the final state of a deleted object.
func fromInformer[T any](obj any) (*T, bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	typed, ok := obj.(*T)
	if !ok {
		klog.ErrorS(nil, "Unexpected object from informer", "type", typeName(obj))
	}
	return typed, ok
}

func typeName(obj any) string { return fmt.Sprintf("%T", obj) }

// serviceEvents adapts the Service informer to the ServiceHandler. A Service that turns
// into a skipped one (ExternalName, headless) is delivered as a delete, and one that
// stops being skipped as an add, so the handler only ever sees Services it proxies
// (all of them with Unproxied).
type serviceEvents struct{ s *InformerSource }

func (e serviceEvents) OnAdd(obj any, _ bool) {
	svc, ok := fromInformer[v1.Service](obj)
	if !ok || e.s.skips(svc) {
		return
	}
	logSCTPPorts(nil, svc)
	logUnusableServiceIPs(nil, svc)
	e.s.queue(serviceCall, func() { e.s.handler.OnServiceAdd(svc) })
}

func (e serviceEvents) OnUpdate(oldObj, newObj any) {
	old, ok1 := fromInformer[v1.Service](oldObj)
	svc, ok2 := fromInformer[v1.Service](newObj)
	if !ok1 || !ok2 || resync(old.ResourceVersion, svc.ResourceVersion) {
		return
	}
	switch skipOld, skipNew := e.s.skips(old), e.s.skips(svc); {
	case skipOld && skipNew:
	case skipNew:
		e.s.queue(serviceCall, func() { e.s.handler.OnServiceDelete(old) })
	case skipOld:
		logSCTPPorts(nil, svc)
		logUnusableServiceIPs(nil, svc)
		e.s.queue(serviceCall, func() { e.s.handler.OnServiceAdd(svc) })
	default:
		logSCTPPorts(old, svc)
		logUnusableServiceIPs(old, svc)
		e.s.queue(serviceCall, func() { e.s.handler.OnServiceUpdate(old, svc) })
	}
}

func (e serviceEvents) OnDelete(obj any) {
	svc, ok := fromInformer[v1.Service](obj)
	if !ok || e.s.skips(svc) {
		return
	}
	e.s.queue(serviceCall, func() { e.s.handler.OnServiceDelete(svc) })
}

// sliceEvents adapts the EndpointSlice informer to the EndpointSliceHandler.
type sliceEvents struct{ s *InformerSource }

func (e sliceEvents) OnAdd(obj any, initial bool) {
	if es, ok := fromInformer[discovery.EndpointSlice](obj); ok {
		e.s.queue(sliceCall, func() {
			if initial {
				e.s.initialSlice()
			}
			e.s.handler.OnEndpointSliceAdd(es)
		})
	}
}

func (e sliceEvents) OnUpdate(oldObj, newObj any) {
	old, ok1 := fromInformer[discovery.EndpointSlice](oldObj)
	es, ok2 := fromInformer[discovery.EndpointSlice](newObj)
	if !ok1 || !ok2 || resync(old.ResourceVersion, es.ResourceVersion) {
		return
	}
	e.s.queue(sliceCall, func() { e.s.handler.OnEndpointSliceUpdate(old, es) })
}

// resync reports an informer's periodic resync: the same object again
// (same resourceVersion), which changes nothing and must not cost a sync
// (with --config-sync-period 2s every Service and slice was a change).
func resync(oldVersion, newVersion string) bool {
	return oldVersion != "" && oldVersion == newVersion
}

func (e sliceEvents) OnDelete(obj any) {
	if es, ok := fromInformer[discovery.EndpointSlice](obj); ok {
		e.s.queue(sliceCall, func() { e.s.handler.OnEndpointSliceDelete(es) })
	}
}

// nodeEvents adapts the Node informer (one Node, by field selector) to the NodeHandler.
type nodeEvents struct{ s *InformerSource }

func (e nodeEvents) OnAdd(obj any, _ bool) { e.change(obj, false) }

func (e nodeEvents) OnUpdate(_, newObj any) { e.change(newObj, false) }

func (e nodeEvents) OnDelete(obj any) { e.change(obj, true) }

func (e nodeEvents) change(obj any, deleted bool) {
	node, ok := fromInformer[v1.Node](obj)
	// The field selector already limits the informer to our Node; the name check keeps
	// that promise even against a server (or fake) that ignores field selectors.
	if !ok || node.Name != e.s.opts.NodeName {
		return
	}
	e.s.nodeSeen.Store(true)
	info := nodeInfo(node, deleted)
	e.s.deliver(func() { e.s.opts.NodeHandler.OnNodeChange(info) })
}
