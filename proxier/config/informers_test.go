package config

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/lockedbuf"
)

// informerRecorder is a Handler and NodeHandler that writes every call as one line.
type informerRecorder struct {
	mu     sync.Mutex
	events []string
	nodes  []NodeInfo
	notify chan struct{}
}

func newInformerRecorder() *informerRecorder {
	return &informerRecorder{notify: make(chan struct{}, 1)}
}

func (r *informerRecorder) add(format string, args ...any) {
	r.mu.Lock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (r *informerRecorder) OnServiceAdd(s *v1.Service) { r.add("svc add %s/%s", s.Namespace, s.Name) }
func (r *informerRecorder) OnServiceUpdate(_, s *v1.Service) {
	r.add("svc update %s/%s", s.Namespace, s.Name)
}
func (r *informerRecorder) OnServiceDelete(s *v1.Service) {
	r.add("svc delete %s/%s", s.Namespace, s.Name)
}
func (r *informerRecorder) OnServiceSynced() { r.add("svc synced") }
func (r *informerRecorder) OnEndpointSliceAdd(es *discovery.EndpointSlice) {
	r.add("slice add %s/%s", es.Namespace, es.Name)
}
func (r *informerRecorder) OnEndpointSliceUpdate(_, es *discovery.EndpointSlice) {
	r.add("slice update %s/%s", es.Namespace, es.Name)
}
func (r *informerRecorder) OnEndpointSliceDelete(es *discovery.EndpointSlice) {
	r.add("slice delete %s/%s", es.Namespace, es.Name)
}
func (r *informerRecorder) OnEndpointSlicesSynced() { r.add("slices synced") }
func (r *informerRecorder) OnNodeChange(n NodeInfo) {
	r.mu.Lock()
	r.nodes = append(r.nodes, n)
	r.mu.Unlock()
	r.add("node %s", n.Name)
}
func (r *informerRecorder) OnNodeSynced() { r.add("node synced") }

func (r *informerRecorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func (r *informerRecorder) lastNode() NodeInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nodes[len(r.nodes)-1]
}

// waitFor waits until event has been recorded and returns everything recorded so far.
func (r *informerRecorder) waitFor(t *testing.T, event string) []string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if got := r.snapshot(); slices.Contains(got, event) {
			return got
		}
		select {
		case <-r.notify:
		case <-deadline:
			t.Fatalf("no %q; recorded %q", event, r.snapshot())
		}
	}
}

func svcFixture(name string, mutate ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10",
			Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

func asHeadless(s *v1.Service) { s.Spec.ClusterIP = v1.ClusterIPNone }

func asExternalName(s *v1.Service) {
	s.Spec.Type, s.Spec.ClusterIP, s.Spec.ExternalName = v1.ServiceTypeExternalName, "", "example.com"
}

func withLabel(key string) func(*v1.Service) {
	return func(s *v1.Service) { s.Labels = map[string]string{key: "x"} }
}

func sliceFixture(name string, labels map[string]string) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   []discovery.Endpoint{{Addresses: []string{"10.1.0.1"}}},
	}
}

// runInformerSource runs an InformerSource until the test ends.
func runInformerSource(t *testing.T, client *fake.Clientset, opts InformerOptions, r *informerRecorder) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewInformerSource(client, r, opts).Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, errNotSynced) {
			t.Errorf("Run: %v", err)
		}
	})
	return done
}

func TestInformerSourceInitialState(t *testing.T) {
	client := fake.NewClientset(
		svcFixture("plain"),
		svcFixture("headless", asHeadless),
		svcFixture("external", asExternalName),
		svcFixture("other-proxy", withLabel("service.kubernetes.io/service-proxy-name")),
		sliceFixture("plain-abc", nil),
		sliceFixture("headless-abc", map[string]string{"service.kubernetes.io/headless": ""}),
	)
	r := newInformerRecorder()
	runInformerSource(t, client, InformerOptions{}, r)
	r.waitFor(t, "slices synced")
	got := r.snapshot()

	want := []string{"svc add ns/plain", "slice add ns/plain-abc"}
	for _, w := range want {
		i := slices.Index(got, w)
		if i < 0 || i > slices.Index(got, "svc synced") {
			t.Errorf("%q missing or after the synced calls in %q", w, got)
		}
	}
	for _, unwanted := range []string{"headless", "external", "other-proxy"} {
		for _, e := range got {
			if e == "svc add ns/"+unwanted || e == "slice add ns/"+unwanted+"-abc" {
				t.Errorf("unexpected %q", e)
			}
		}
	}
	if len(got) != 4 {
		t.Errorf("recorded %q, want the two adds and the two synced calls", got)
	}
}

// A label that takes a Service out of ProxyLabelSelector arrives as a watch DELETE from a
// real API server (the fake ignores selectors on watch); test/controlplane covers that.
func TestInformerSourceServiceTransitions(t *testing.T) {
	otherName := func(s *v1.Service) { s.Spec.ExternalName = "other.example.com" }
	tests := []struct {
		name   string
		before *v1.Service
		after  *v1.Service
		want   []string // the calls the change must produce, nothing else
	}{
		{"port change", svcFixture("a"), svcFixture("a", func(s *v1.Service) { s.Spec.Ports[0].Port = 81 }), []string{"svc update ns/a"}},
		{"turns ExternalName", svcFixture("a"), svcFixture("a", asExternalName), []string{"svc delete ns/a"}},
		{"stops being ExternalName", svcFixture("a", asExternalName), svcFixture("a"), []string{"svc add ns/a"}},
		{"stays ExternalName", svcFixture("a", asExternalName), svcFixture("a", asExternalName, otherName), nil},
		{"stays headless", svcFixture("a", asHeadless), svcFixture("a", asHeadless, withLabel("x")), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A marker Service changed after the one under test: the informer delivers in
			// order, so once the marker's update is seen, every call for "a" has been made.
			marker := svcFixture("marker")
			client := fake.NewClientset(tt.before, marker)
			r := newInformerRecorder()
			runInformerSource(t, client, InformerOptions{}, r)
			before := len(r.waitFor(t, "slices synced"))

			ctx := context.Background()
			if _, err := client.CoreV1().Services("ns").Update(ctx, tt.after, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := client.CoreV1().Services("ns").Update(ctx, svcFixture("marker", withLabel("touched")), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			got := r.waitFor(t, "svc update ns/marker")[before:]
			want := append(slices.Clone(tt.want), "svc update ns/marker")
			if !slices.Equal(got, want) {
				t.Errorf("after the update recorded %q, want %q", got, want)
			}
		})
	}
}

func TestInformerSourceDeletes(t *testing.T) {
	client := fake.NewClientset(svcFixture("a"), svcFixture("h", asHeadless), sliceFixture("a-1", nil))
	r := newInformerRecorder()
	runInformerSource(t, client, InformerOptions{}, r)
	before := len(r.waitFor(t, "slices synced"))

	ctx := context.Background()
	for _, name := range []string{"h", "a"} { // the headless one first: it must stay silent
		if err := client.CoreV1().Services("ns").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "a-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "slice delete ns/a-1")
	got := r.waitFor(t, "svc delete ns/a")[before:]
	if len(got) != 2 {
		t.Errorf("recorded %q, want exactly the deletes of ns/a and ns/a-1", got)
	}
}

func TestInformerEventsUnwrapTombstones(t *testing.T) {
	tomb := func(obj runtime.Object) cache.DeletedFinalStateUnknown {
		return cache.DeletedFinalStateUnknown{Key: "ns/x", Obj: obj}
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	tests := []struct {
		name    string
		deliver func(s *InformerSource)
		want    []string
	}{
		{"service", func(s *InformerSource) { serviceEvents{s}.OnDelete(tomb(svcFixture("a"))) }, []string{"svc delete ns/a"}},
		{"headless service", func(s *InformerSource) { serviceEvents{s}.OnDelete(tomb(svcFixture("a", asHeadless))) }, nil},
		{"slice", func(s *InformerSource) { sliceEvents{s}.OnDelete(tomb(sliceFixture("a-1", nil))) }, []string{"slice delete ns/a-1"}},
		{"node", func(s *InformerSource) { nodeEvents{s}.OnDelete(tomb(node)) }, []string{"node n1"}},
		{"wrong type", func(s *InformerSource) { sliceEvents{s}.OnDelete(tomb(svcFixture("a"))) }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newInformerRecorder()
			s := NewInformerSource(fake.NewClientset(), r, InformerOptions{NodeName: "n1", NodeHandler: r})
			tt.deliver(s)
			s.deliverCalls(s.takeCalls()) // no Run: deliver what was handed over
			if got := r.snapshot(); !slices.Equal(got, tt.want) {
				t.Errorf("recorded %q, want %q", got, tt.want)
			}
		})
	}
	r := newInformerRecorder()
	s := NewInformerSource(fake.NewClientset(), r, InformerOptions{NodeName: "n1", NodeHandler: r})
	nodeEvents{s}.OnDelete(tomb(node))
	s.deliverCalls(s.takeCalls())
	if n := r.lastNode(); !n.Deleted {
		t.Errorf("node from a tombstone: %+v, want Deleted", n)
	}
}

func TestInformerSourceSyncedWaitsForBothCaches(t *testing.T) {
	client := fake.NewClientset(svcFixture("a"), sliceFixture("a-1", nil))
	// The fake runs reactors under one lock, so a reactor must not block: until released,
	// listing slices fails and the reflector retries.
	var released atomic.Bool
	client.PrependReactor("list", "endpointslices", failUntil(&released))
	r := newInformerRecorder()
	runInformerSource(t, client, InformerOptions{}, r)

	r.waitFor(t, "svc add ns/a")
	// The Service cache is complete; the slice list is held back, so nothing may say synced.
	for _, e := range r.snapshot() {
		if e == "svc synced" || e == "slices synced" {
			t.Fatalf("%q before the EndpointSlice cache synced", e)
		}
	}
	released.Store(true)
	got := r.waitFor(t, "slices synced")
	if i, j := slices.Index(got, "slice add ns/a-1"), slices.Index(got, "svc synced"); i < 0 || i > j {
		t.Errorf("recorded %q: the slice must come before the synced calls", got)
	}
}

// failUntil is a reactor that fails every call until released is set, then lets the
// call through to the fake's object tracker.
func failUntil(released *atomic.Bool) k8stesting.ReactionFunc {
	return func(k8stesting.Action) (bool, runtime.Object, error) {
		if released.Load() {
			return false, nil, nil
		}
		return true, nil, errors.New("held back by the test")
	}
}

func TestInformerSourceRunEndsBeforeSync(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "services", failUntil(new(atomic.Bool)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewInformerSource(client, newInformerRecorder(), InformerOptions{}).Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, errNotSynced) {
			t.Errorf("Run = %v, want %v", err, errNotSynced)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestInformerSourceNode(t *testing.T) {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeHostName, Address: "n1"},
			{Type: v1.NodeExternalIP, Address: "203.0.113.7"},
			{Type: v1.NodeInternalIP, Address: "192.168.1.7"},
			{Type: v1.NodeInternalIP, Address: "fd00::7"},
		}},
	}
	other := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}
	client := fake.NewClientset(node, other)
	r := newInformerRecorder()
	runInformerSource(t, client, InformerOptions{NodeName: "n1", NodeHandler: r}, r)
	r.waitFor(t, "node synced")

	want := NodeInfo{
		Name: "n1", Zone: "zone-a",
		Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.7"), netip.MustParseAddr("fd00::7"), netip.MustParseAddr("203.0.113.7")},
	}
	if got := r.lastNode(); !equalNodeInfo(got, want) {
		t.Errorf("node = %+v, want %+v", got, want)
	}
	if slices.Contains(r.snapshot(), "node n2") {
		t.Error("another node was delivered")
	}

	ctx := context.Background()
	// The cluster autoscaler's taint marks the node as going (kube-proxy's
	// KEP-3836), as a deletionTimestamp does; without it, it is not.
	tainted := node.DeepCopy()
	tainted.Spec.Taints = []v1.Taint{{Key: ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
	if _, err := client.CoreV1().Nodes().Update(ctx, tainted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !waitNode(t, r, func(n NodeInfo) bool { return n.Terminating }) {
		t.Errorf("node %+v, want Terminating (ToBeDeletedByClusterAutoscaler)", r.lastNode())
	}
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !waitNode(t, r, func(n NodeInfo) bool { return !n.Terminating }) {
		t.Errorf("node %+v, want not Terminating once the taint is gone", r.lastNode())
	}
	terminating := node.DeepCopy()
	terminating.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	if _, err := client.CoreV1().Nodes().Update(ctx, terminating, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !waitNode(t, r, func(n NodeInfo) bool { return n.Terminating }) {
		t.Errorf("node %+v, want Terminating", r.lastNode())
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !waitNode(t, r, func(n NodeInfo) bool { return n.Deleted }) {
		t.Errorf("node %+v, want Deleted", r.lastNode())
	}
	// A deleted Node has no zone: kube-proxy's OnNodeDelete drops the
	// node's labels, so topology hints stop narrowing its endpoints (the
	// deleted object's zone kept them on its old zone's endpoints).
	if n := r.lastNode(); n.Zone != "" {
		t.Errorf("deleted node's zone %q, want none", n.Zone)
	}
}

func waitNode(t *testing.T, r *informerRecorder, ok func(NodeInfo) bool) bool {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !ok(r.lastNode()) {
		select {
		case <-r.notify:
		case <-deadline:
			return false
		}
	}
	return true
}

func equalNodeInfo(a, b NodeInfo) bool {
	return a.Name == b.Name && a.Zone == b.Zone && a.Terminating == b.Terminating &&
		a.Deleted == b.Deleted && slices.Equal(a.Addresses, b.Addresses)
}

// An informer's periodic resync hands every object again with the same
// resourceVersion: nothing changed, so nothing is delivered (each was a
// change and a sync). A new version is delivered.
func TestInformerResyncIsNoChange(t *testing.T) {
	r := newInformerRecorder()
	s := NewInformerSource(fake.NewClientset(), r, InformerOptions{})
	svc, es := svcFixture("a"), sliceFixture("a-1", nil)
	svc.ResourceVersion, es.ResourceVersion = "7", "9"
	serviceEvents{s}.OnUpdate(svc, svc.DeepCopy())
	sliceEvents{s}.OnUpdate(es, es.DeepCopy())
	s.deliverCalls(s.takeCalls()) // no Run: deliver what was handed over
	if got := r.snapshot(); len(got) != 0 {
		t.Fatalf("a resync delivered %q", got)
	}
	newer, newerSlice := svc.DeepCopy(), es.DeepCopy()
	newer.ResourceVersion, newerSlice.ResourceVersion = "8", "10"
	serviceEvents{s}.OnUpdate(svc, newer)
	sliceEvents{s}.OnUpdate(es, newerSlice)
	s.deliverCalls(s.takeCalls())
	if got := r.snapshot(); len(got) != 2 {
		t.Fatalf("new versions delivered %q, want an update of each", got)
	}
}

// A Node that never appears is logged once, as kube-proxy logs that it
// timed out waiting for it; one that exists is not. Through Run, so the
// wait is started and the Node's delivery is what ends it.
func TestInformerSourceLogsMissingNode(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		want    bool
	}{
		{"no Node", nil, true},
		{"the Node exists", []runtime.Object{node}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &lockedbuf.Buffer{}
			klog.SetOutput(logs)
			klog.LogToStderr(false)
			t.Cleanup(func() { klog.SetOutput(nil); klog.LogToStderr(true) })
			r := newInformerRecorder()
			s := NewInformerSource(fake.NewClientset(tc.objects...), r, InformerOptions{NodeName: "n1", NodeHandler: r})
			s.nodeMissingAfter = 50 * time.Millisecond
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			r.waitFor(t, "node synced")
			time.Sleep(200 * time.Millisecond)
			cancel()
			<-done
			klog.Flush()
			if got := strings.Contains(logs.String(), "Timed out waiting for this proxy's Node object") && strings.Contains(logs.String(), `node="n1"`); got != tc.want {
				t.Errorf("logged %v, want %v; log:\n%s", got, tc.want, logs.String())
			}
			// It says what /healthz answers meanwhile: 503, nodeEligible
			// false (it said the node counted as eligible).
			if tc.want && (!strings.Contains(logs.String(), "/healthz answers 503 (nodeEligible false)") || strings.Contains(logs.String(), "counts as eligible")) {
				t.Errorf("the line does not say /healthz answers 503 meanwhile:\n%s", logs.String())
			}
		})
	}
}
