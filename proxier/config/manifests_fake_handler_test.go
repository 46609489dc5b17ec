package config

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// manifestRecorder is a Handler that records every call as one line such as
// "add Service default/web" and keeps the latest version of each object.
type manifestRecorder struct {
	mu      sync.Mutex
	events  []string
	objects map[string]any
	notify  chan struct{}
}

func newManifestRecorder() *manifestRecorder {
	return &manifestRecorder{objects: map[string]any{}, notify: make(chan struct{}, 1)}
}

func (r *manifestRecorder) record(verb, kind, ns, name string, obj any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := kind + " " + ns + "/" + name
	if name == "" {
		key = kind
	}
	r.events = append(r.events, verb+" "+key)
	if verb == "delete" {
		delete(r.objects, key)
	} else if obj != nil {
		r.objects[key] = obj
	}
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (r *manifestRecorder) OnServiceAdd(s *v1.Service) {
	r.record("add", "Service", s.Namespace, s.Name, s)
}
func (r *manifestRecorder) OnServiceUpdate(_, s *v1.Service) {
	r.record("update", "Service", s.Namespace, s.Name, s)
}
func (r *manifestRecorder) OnServiceDelete(s *v1.Service) {
	r.record("delete", "Service", s.Namespace, s.Name, s)
}
func (r *manifestRecorder) OnServiceSynced() { r.record("synced", "Service", "", "", nil) }
func (r *manifestRecorder) OnEndpointSliceAdd(e *discovery.EndpointSlice) {
	r.record("add", "EndpointSlice", e.Namespace, e.Name, e)
}
func (r *manifestRecorder) OnEndpointSliceUpdate(_, e *discovery.EndpointSlice) {
	r.record("update", "EndpointSlice", e.Namespace, e.Name, e)
}
func (r *manifestRecorder) OnEndpointSliceDelete(e *discovery.EndpointSlice) {
	r.record("delete", "EndpointSlice", e.Namespace, e.Name, e)
}
func (r *manifestRecorder) OnEndpointSlicesSynced() { r.record("synced", "EndpointSlice", "", "", nil) }

// take returns and clears the events recorded so far.
func (r *manifestRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// waitFor waits (bounded) until the recorded events equal want, then clears them.
func (r *manifestRecorder) waitFor(t *testing.T, within time.Duration, want ...string) {
	t.Helper()
	deadline := time.After(within)
	var got []string
	for {
		r.mu.Lock()
		got = append([]string(nil), r.events...)
		r.mu.Unlock()
		if len(got) >= len(want) {
			break
		}
		select {
		case <-r.notify:
		case <-deadline:
			t.Fatalf("after %v got events %q, want %q", within, got, want)
		}
	}
	r.take()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got events %q, want %q", got, want)
	}
}

func (r *manifestRecorder) serviceYAML(key string) *v1.Service {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, _ := r.objects["Service "+key].(*v1.Service)
	return s
}

// manifestErrors is an error reporter that tests can read while the source runs.
type manifestErrors struct {
	mu   sync.Mutex
	msgs []string
}

func (l *manifestErrors) report(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, err.Error())
}

func (l *manifestErrors) contains(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

func (l *manifestErrors) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.msgs)
}

// object is the latest version of the object recorded under key
// ("Service default/web").
func (r *manifestRecorder) object(key string) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.objects[key]
}
