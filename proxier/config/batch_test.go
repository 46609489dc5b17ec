package config

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// batchingManifestRecorder records batches (Batcher) with the events.
type batchingManifestRecorder struct{ *manifestRecorder }

func (r batchingManifestRecorder) BeginBatch() { r.record("begin", "batch", "", "", nil) }
func (r batchingManifestRecorder) EndBatch()   { r.record("end", "batch", "", "", nil) }

// TestManifestReloadIsOneBatch: a reload's events reach a Batcher as one
// batch, the first load's before the synced calls: delivered one by one,
// the N slices of one Service were each merged with all the others
// (5,000 one-endpoint slices: 19 s of CPU before the first sync).
func TestManifestReloadIsOneBatch(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "web.yaml")
	write := func(last string) {
		docs := []string{serviceYAML("web", 80)}
		for i := range 3 {
			addr := fmt.Sprintf("10.1.0.%d", i+1)
			if i == 2 {
				addr = last
			}
			docs = append(docs, sliceYAML(fmt.Sprintf("web-%d", i), "IPv4", addr))
		}
		writeFile(t, file, strings.Join(docs, "---\n"))
	}
	write("10.1.0.3")
	rec := batchingManifestRecorder{newManifestRecorder()}
	src := newIdleSource(t, dir, rec)
	want := []string{"begin batch", "add Service default/web",
		"add EndpointSlice default/web-0", "add EndpointSlice default/web-1", "add EndpointSlice default/web-2",
		"end batch"}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("first load: %q, want %q", got, want)
	}
	write("10.1.0.9") // one slice of the file changed
	src.reload()
	want = []string{"begin batch", "update EndpointSlice default/web-2", "end batch"}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("reload: %q, want %q", got, want)
	}
	writeFile(t, file, serviceYAML("web", 80)) // the slices taken out
	src.reload()
	want = []string{"begin batch", "delete EndpointSlice default/web-0", "delete EndpointSlice default/web-1",
		"delete EndpointSlice default/web-2", "end batch"}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("slices removed: %q, want %q", got, want)
	}

	// Run: the first load's batch ends before the synced calls.
	write("10.1.0.3")
	rec = batchingManifestRecorder{newManifestRecorder()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewManifestSource(dir, rec, WithoutWatcher()).Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()
	rec.waitFor(t, liveWait, "begin batch", "add Service default/web",
		"add EndpointSlice default/web-0", "add EndpointSlice default/web-1", "add EndpointSlice default/web-2",
		"end batch", "synced Service", "synced EndpointSlice")
}

// batchingInformerRecorder records batches (Batcher) with the events.
type batchingInformerRecorder struct{ *informerRecorder }

func (r batchingInformerRecorder) BeginBatch() { r.add("batch begin") }
func (r batchingInformerRecorder) EndBatch()   { r.add("batch end") }

// TestInformerInitialListIsOneBatch: the slices of the informers' initial
// list reach a Batcher as one batch, ended before the synced calls; a
// slice added afterwards (a watch event) is delivered alone, at once.
func TestInformerInitialListIsOneBatch(t *testing.T) {
	client := fake.NewClientset(svcFixture("a"), sliceFixture("a-1", nil), sliceFixture("a-2", nil), sliceFixture("a-3", nil))
	r := batchingInformerRecorder{newInformerRecorder()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewInformerSource(client, r, InformerOptions{}).Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	got := r.waitFor(t, "slices synced")
	var slicesSeen []string
	for _, e := range got {
		if strings.HasPrefix(e, "slice add") || strings.HasPrefix(e, "batch") || strings.HasSuffix(e, "synced") {
			slicesSeen = append(slicesSeen, e)
		}
	}
	want := []string{"batch begin", "slice add ns/a-1", "slice add ns/a-2", "slice add ns/a-3", "batch end", "svc synced", "slices synced"}
	if !slices.Equal(slicesSeen, want) {
		t.Fatalf("initial list: %q, want %q", slicesSeen, want)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, sliceFixture("a-4", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got = r.waitFor(t, "slice add ns/a-4")
	if i := slices.Index(got, "slice add ns/a-4"); slices.Contains(got[len(want):], "batch begin") || i != len(got)-1 {
		t.Fatalf("after the sync: %q, want the new slice alone, in no batch", got)
	}
}

// heldRecorder is a batchingInformerRecorder whose update of one slice
// waits until released: the events that come meanwhile pile up.
type heldRecorder struct {
	batchingInformerRecorder
	slice    string
	held     chan struct{} // closed once the update is being delivered
	released chan struct{}
}

func (r heldRecorder) OnEndpointSliceUpdate(old, es *discovery.EndpointSlice) {
	r.batchingInformerRecorder.OnEndpointSliceUpdate(old, es)
	if es.Name == r.slice {
		close(r.held)
		<-r.released
	}
}

// TestInformerBurstIsOneBatch: the slice events that come while the ones
// before are delivered (a resumed watch or a relist after an outage hands
// every slice changed meanwhile at once) reach a Batcher as one batch;
// delivered one by one, each merged every slice of its Service (5,000
// one-endpoint slices of one Service changed during an outage: 63 s of
// CPU). The event that came alone was delivered alone, at once.
func TestInformerBurstIsOneBatch(t *testing.T) {
	client := fake.NewClientset(svcFixture("a"), sliceFixture("a-1", nil), sliceFixture("a-2", nil), sliceFixture("a-3", nil))
	r := heldRecorder{batchingInformerRecorder{newInformerRecorder()}, "a-1", make(chan struct{}), make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	src := NewInformerSource(client, r, InformerOptions{})
	go func() { done <- src.Run(ctx) }()
	released := false
	defer func() {
		if !released {
			close(r.released)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	listed := len(r.waitFor(t, "slices synced"))
	update := func(name, addr string) {
		es := sliceFixture(name, nil)
		es.Endpoints[0].Addresses = []string{addr}
		if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	update("a-1", "10.1.0.9")
	select {
	case <-r.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the update of ns/a-1 was not delivered")
	}
	update("a-2", "10.1.0.9")
	update("a-3", "10.1.0.9")
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, sliceFixture("a-4", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); handedOver(src) < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the 3 events handed over while ns/a-1's update was delivered", handedOver(src))
		}
		time.Sleep(time.Millisecond)
	}
	close(r.released)
	released = true
	want := []string{"slice update ns/a-1", "batch begin", "slice update ns/a-2", "slice update ns/a-3", "slice add ns/a-4", "batch end"}
	got := r.waitFor(t, "slice add ns/a-4")[listed:]
	for deadline := time.Now().Add(10 * time.Second); len(got) < len(want) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		got = r.snapshot()[listed:]
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after the sync: %q, want %q", got, want)
	}
}

// handedOver is how many calls the source's informers handed over and it
// has not delivered yet.
func handedOver(s *InformerSource) int {
	s.calls.mu.Lock()
	defer s.calls.mu.Unlock()
	return len(s.calls.pending)
}

// heldListRecorder records batches and events, and holds its first slice
// add until release is closed.
type heldListRecorder struct {
	batchingInformerRecorder
	held, release chan struct{}
	first         sync.Once
}

func (r *heldListRecorder) OnEndpointSliceAdd(es *discovery.EndpointSlice) {
	r.batchingInformerRecorder.OnEndpointSliceAdd(es)
	r.first.Do(func() {
		close(r.held)
		<-r.release
	})
}

// TestInformerRunEndingMidListEndsItsBatch: Run stopped while the slices'
// initial list is being delivered (its first slice opened the batch, the
// rest not yet given) ends that batch on its way out, so the handler is
// not left holding the slices it was given unserved. The first slice's
// delivery is held until Run has given up waiting for the sync (its stack
// is past its wait for the sync: in the informers' shutdown, or waiting
// for the delivery loop, which holds the first slice): no timing decides which path ends
// the batch.
func TestInformerRunEndingMidListEndsItsBatch(t *testing.T) {
	client := fake.NewClientset(svcFixture("a"), sliceFixture("a-1", nil), sliceFixture("a-2", nil))
	r := &heldListRecorder{batchingInformerRecorder: batchingInformerRecorder{newInformerRecorder()},
		held: make(chan struct{}), release: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- NewInformerSource(client, r, InformerOptions{}).Run(ctx) }()
	released := false
	defer func() {
		if !released {
			close(r.release)
		}
	}()
	select {
	case <-r.held:
	case <-time.After(liveWait):
		t.Fatal("no slice delivered")
	}
	cancel()
	pastTheWait := func() bool {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			// Run's own goroutine, past its wait: in the informers'
			// shutdown, or waiting in its deferred end for the delivery
			// loop, which holds the first slice.
			if strings.Contains(g, "(*InformerSource).Run") && !strings.Contains(g, "waitSynced") {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(liveWait); !pastTheWait(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Run did not stop waiting for the sync after its context was cancelled")
		}
	}
	close(r.release)
	released = true
	select {
	case <-done:
	case <-time.After(liveWait):
		t.Fatal("Run did not return")
	}
	var batches []string
	for _, e := range r.snapshot() {
		if strings.HasPrefix(e, "batch") {
			batches = append(batches, e)
		}
	}
	if want := []string{"batch begin", "batch end"}; !slices.Equal(batches, want) {
		t.Errorf("Run stopped mid-list: batches %q, want %q (the list's batch ended)", batches, want)
	}
}

// TestLastKnownStateBatches: the last known state passes a source's
// batches on, and hands the file's objects, and the deletes of those the
// source does not hold, each as a batch of their own.
func TestLastKnownStateBatches(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	writeState(t, path, []*v1.Service{stateService("a", "10.96.0.1")},
		[]*discovery.EndpointSlice{stateSlice("a", "a-1", "10.1.0.1"), stateSlice("a", "a-2", "10.1.0.2")})
	rec := batchingManifestRecorder{newManifestRecorder()}
	s := NewLastKnownState(path, rec, 10*time.Millisecond)
	s.writeEvery = time.Hour
	stop := runState(t, s)
	defer stop()
	rec.waitFor(t, 5*time.Second, "begin batch", "add Service default/a",
		"add EndpointSlice default/a-1", "add EndpointSlice default/a-2", "end batch",
		"synced Service", "synced EndpointSlice")

	s.BeginBatch()
	s.OnServiceAdd(stateService("a", "10.96.0.1"))
	s.OnEndpointSliceAdd(stateSlice("a", "a-1", "10.1.0.9"))
	s.EndBatch()
	s.OnServiceSynced()
	s.OnEndpointSlicesSynced()
	rec.waitFor(t, 5*time.Second, "begin batch", "update Service default/a", "update EndpointSlice default/a-1", "end batch",
		"begin batch", "delete EndpointSlice default/a-2", "end batch")
}
