package config

//lint:file-ignore SA1019 v1.Endpoints is read on purpose: manifests may hold them, and they are converted to EndpointSlices

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
)

// objectKey identifies a delivered object (Kind is Service or EndpointSlice)
// or, as a source key, a manifest object (Kind may also be Endpoints).
type objectKey struct {
	Kind, Namespace, Name string
}

func (k objectKey) String() string { return k.Kind + " " + k.Namespace + "/" + k.Name }

// servedObject is one object a file contributes, as delivered to the handler.
type servedObject struct {
	key    objectKey
	source objectKey // the manifest it came from; differs for slices converted from Endpoints
	file   string
	doc    int
	obj    runtime.Object

	allocated bool // a Service whose clusterIPs the allocator gave, not its file
}

// fileState is the last good contribution of one manifest file.
type fileState struct {
	digest     [sha256.Size]byte
	objects    []servedObject
	docs       map[docDigest][]Manifest // its documents that decoded without error, for the next version
	otherKinds []string                 // the kind of each object of a kind the proxy does not use
}

// applyFile decodes new content for a file and returns its new state. Only
// what decoded and validated replaces the old state: an identified invalid
// object keeps its previous version from this file, and a document that could
// not even be identified keeps every previous object of the file that the new
// content does not provide.
func (d decoder) applyFile(file string, data []byte, prev *fileState) (*fileState, []error) {
	var known map[docDigest][]Manifest
	if prev != nil {
		known = prev.docs
	}
	manifests, errs, docs, otherKinds := d.decodeKnown(file, data, known)
	next := &fileState{digest: sha256.Sum256(data), docs: docs, otherKinds: otherKinds}
	provided := map[objectKey]bool{}
	for _, m := range manifests {
		src := objectKey{m.Kind, m.Namespace, m.Name}
		provided[src] = true
		next.objects = append(next.objects, deliverables(file, m.Doc, src, m.Object)...)
	}
	if prev == nil {
		return next, errs
	}
	keepAll := false
	keep := map[objectKey]bool{}
	for _, err := range errs {
		var merr *ManifestError
		if errors.As(err, &merr) && merr.Identified() {
			keep[objectKey{merr.Kind, merr.Namespace, merr.Name}] = true
		} else {
			keepAll = true
		}
	}
	for _, o := range prev.objects {
		if !provided[o.source] && (keepAll || keep[o.source]) {
			next.objects = append(next.objects, o)
		}
	}
	return next, errs
}

// deliverables turns one decoded manifest into what the handler receives:
// nothing for what ProxyLabelSelector leaves out, as the informers list
// it (a Service another proxy serves, a headless Service's slices).
func deliverables(file string, doc int, src objectKey, obj runtime.Object) []servedObject {
	var out []servedObject
	add := func(key objectKey, o runtime.Object) {
		if m, ok := o.(metav1.Object); ok && !proxySelector.Matches(labels.Set(m.GetLabels())) {
			klog.V(2).InfoS("Manifest object left to another proxy by its labels", "object", key, "file", file, "selector", ProxyLabelSelector)
			return
		}
		out = append(out, servedObject{key: key, source: src, file: file, doc: doc, obj: o})
	}
	switch o := obj.(type) {
	case *v1.Endpoints:
		for _, es := range EndpointsToSlices(o) {
			add(objectKey{KindEndpointSlice, es.Namespace, es.Name}, es)
		}
	default:
		add(src, obj)
	}
	return out
}

// proxySelector is ProxyLabelSelector, parsed once.
var proxySelector = func() labels.Selector {
	s, err := labels.Parse(ProxyLabelSelector)
	if err != nil {
		panic(err)
	}
	return s
}()

// resolve merges the files' contributions into the desired set. A key defined
// twice is an error naming both places, and the first in file order (files
// sorted by name, then documents in order) is used, whatever was served
// before: a restart, or another node, with the same files serves the same
// version. When the one being served loses, diff makes that an update of the
// object, as an edit of its file would.
func resolve(files map[string]*fileState) (map[objectKey]servedObject, []error) {
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	slices.Sort(names)
	desired := map[objectKey]servedObject{}
	var errs []error
	for _, f := range names {
		for _, o := range files[f].objects {
			first, dup := desired[o.key]
			if !dup {
				desired[o.key] = o
				continue
			}
			errs = append(errs, fmt.Errorf("%s is defined twice: in %s (document %d) and in %s (document %d); using %s (document %d)",
				o.key, first.file, first.doc, o.file, o.doc, first.file, first.doc))
		}
	}
	return desired, errs
}

// event is one handler call to make.
type event struct {
	old, cur *servedObject // old nil: Add; cur nil: Delete; both: Update
}

// diff lists the events that turn served into desired, Services first, then
// slices, each by namespace/name. Unchanged objects produce no event.
func diff(served, desired map[objectKey]servedObject) []event {
	var evs []event
	for k, cur := range desired {
		if old, ok := served[k]; !ok {
			evs = append(evs, event{cur: &cur})
		} else if old.obj != cur.obj && !equality.Semantic.DeepEqual(old.obj, cur.obj) {
			evs = append(evs, event{old: &old, cur: &cur})
		}
	}
	for k, old := range served {
		if _, ok := desired[k]; !ok {
			evs = append(evs, event{old: &old})
		}
	}
	slices.SortFunc(evs, func(a, b event) int {
		ka, kb := a.key(), b.key()
		return cmp.Or(
			cmp.Compare(kindOrder(ka.Kind), kindOrder(kb.Kind)),
			cmp.Compare(ka.Namespace, kb.Namespace),
			cmp.Compare(ka.Name, kb.Name))
	})
	return evs
}

func (e event) key() objectKey {
	if e.cur != nil {
		return e.cur.key
	}
	return e.old.key
}

// kindOrder delivers Services before their slices.
func kindOrder(kind string) int {
	if kind == KindService {
		return 0
	}
	return 1
}

// deliver makes the handler call for one event.
func deliver(h Handler, e event) {
	switch {
	case e.old == nil:
		switch o := e.cur.obj.(type) {
		case *v1.Service:
			logSCTPPorts(nil, o)
			h.OnServiceAdd(o)
		case *discovery.EndpointSlice:
			h.OnEndpointSliceAdd(o)
		}
	case e.cur == nil:
		switch o := e.old.obj.(type) {
		case *v1.Service:
			h.OnServiceDelete(o)
		case *discovery.EndpointSlice:
			h.OnEndpointSliceDelete(o)
		}
	default:
		switch o := e.cur.obj.(type) {
		case *v1.Service:
			logSCTPPorts(e.old.obj.(*v1.Service), o)
			h.OnServiceUpdate(e.old.obj.(*v1.Service), o)
		case *discovery.EndpointSlice:
			h.OnEndpointSliceUpdate(e.old.obj.(*discovery.EndpointSlice), o)
		}
	}
}
