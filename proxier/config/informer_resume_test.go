package config

import (
	"context"
	"errors"
	"flag"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// streamLost is the Error event client-go's StreamWatcher sends when the
// connection under a watch breaks.
func streamLost() watch.Event {
	obj := apierrors.NewClientErrorReporter(500, "GET", clientStreamFailure).
		AsObject(errors.New("unable to decode an event from the watch stream: read tcp: software caused connection abort"))
	return watch.Event{Type: watch.Error, Object: obj}
}

func svcAt(name, rv string) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}}
}

func initialEventsEndAt(rv string) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv,
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
}

// TestReflectorDoesNotBackOffAtAStreamEnd: a reflector over a
// patientListWatch whose watch-list stream, once its initial events are in,
// breaks (a connection cut) or is ended by the server at once (as a server
// does right after its restart) goes on from the last resourceVersion at
// once, without listing again. Seen by the reflector, either end made it
// sleep its backoff and list again (0.8-1.6 s the first time, doubling with
// every outage within two minutes: after a few short outages in a row,
// changes were seen up to a minute after the API server answered again).
func TestReflectorDoesNotBackOffAtAStreamEnd(t *testing.T) {
	defer func(d time.Duration) { resumeEvery = d }(resumeEvery)
	resumeEvery = 10 * time.Millisecond
	for _, tt := range []struct {
		name   string
		end    func(*watch.FakeWatcher)
		wantRV string
	}{
		{"connection lost", func(w *watch.FakeWatcher) {
			w.Add(svcAt("b", "11"))
			ev := streamLost()
			w.Action(ev.Type, ev.Object)
		}, "11"},
		// Nothing after the initial events: a "very short watch" to the reflector.
		{"closed by the server at once", func(w *watch.FakeWatcher) { w.Stop() }, "10"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			watchers := make(chan *watch.FakeWatcher, 4)
			var lists, watches atomic.Int32
			var mu sync.Mutex
			var rvs []string
			inner := &cache.ListWatch{
				ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
					lists.Add(1)
					return &v1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
				},
				WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
					watches.Add(1)
					mu.Lock()
					rvs = append(rvs, o.ResourceVersion)
					mu.Unlock()
					w := watch.NewFake()
					watchers <- w
					return w, nil
				},
			}
			p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return true }), "test")
			store, stop := runReflector(p)
			defer stop()

			first := <-watchers // a watch-list, as against a real API server
			first.Add(svcAt("a", "9"))
			first.Action(watch.Bookmark, initialEventsEndAt("10"))
			tt.end(first)
			ended := time.Now()
			var next *watch.FakeWatcher
			select {
			case next = <-watchers:
			case <-time.After(5 * time.Second):
				t.Fatal("no new watch within 5 s of the stream's end")
			}
			if took := time.Since(ended); took > 500*time.Millisecond {
				t.Errorf("watched again %v after the stream ended, want at once (no backoff)", took.Round(time.Millisecond))
			}
			mu.Lock()
			got := append([]string(nil), rvs...)
			mu.Unlock()
			if len(got) != 2 || got[1] != tt.wantRV || lists.Load() != 0 {
				t.Errorf("watches from resourceVersions %q after %d lists, want a resume from %s without a list", got, lists.Load(), tt.wantRV)
			}
			next.Add(svcAt("c", "12"))
			deadline := time.Now().Add(5 * time.Second)
			for !storeHas(store, "ns/c") && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if !storeHas(store, "ns/c") {
				t.Errorf("store holds %v, not the resumed watch's event", store.ListKeys())
			}
		})
	}
}

// TestResumableWatch: which ends are resumed and which are handed on.
func TestResumableWatch(t *testing.T) {
	defer func(d time.Duration) { resumeEvery = d }(resumeEvery)
	resumeEvery = time.Millisecond
	gone := apierrors.NewResourceExpired("too old resource version: 1 (5)")
	for _, tt := range []struct {
		name      string
		opts      metav1.ListOptions
		events    []watch.Event
		resumeErr error             // what the resume returns (nil: a watch with one Added at rv 50)
		want      []watch.EventType // what the reflector is given, in order, before the end
		wantRV    string            // the resume's resourceVersion ("": no resume)
	}{
		{"lost stream: resumed", metav1.ListOptions{},
			[]watch.Event{{Type: watch.Added, Object: svcAt("a", "2")}, streamLost()}, nil,
			[]watch.EventType{watch.Added, watch.Added}, "2"},
		{"closed stream: resumed", metav1.ListOptions{},
			[]watch.Event{{Type: watch.Modified, Object: svcAt("a", "3")}}, nil,
			[]watch.EventType{watch.Modified, watch.Added}, "3"},
		{"a server's error is handed on", metav1.ListOptions{},
			[]watch.Event{{Type: watch.Added, Object: svcAt("a", "2")}, {Type: watch.Error, Object: &gone.ErrStatus}}, nil,
			[]watch.EventType{watch.Added, watch.Error}, ""},
		{"watch-list: lost before its initial events ended: handed on", metav1.ListOptions{SendInitialEvents: ptr.To(true)},
			[]watch.Event{{Type: watch.Added, Object: svcAt("a", "2")}, streamLost()}, nil,
			[]watch.EventType{watch.Added, watch.Error}, ""},
		{"watch-list: lost after them: resumed", metav1.ListOptions{SendInitialEvents: ptr.To(true)},
			[]watch.Event{{Type: watch.Added, Object: svcAt("a", "2")}, {Type: watch.Bookmark, Object: initialEventsEndAt("7")}, streamLost()}, nil,
			[]watch.EventType{watch.Added, watch.Bookmark, watch.Added}, "7"},
		{"a resume the server refuses: its error is handed on", metav1.ListOptions{},
			[]watch.Event{{Type: watch.Added, Object: svcAt("a", "2")}, streamLost()}, gone,
			[]watch.EventType{watch.Added, watch.Error}, "2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inner := watch.NewFakeWithChanSize(len(tt.events), false)
			for _, ev := range tt.events {
				inner.Action(ev.Type, ev.Object)
			}
			if len(tt.events) == 0 || tt.events[len(tt.events)-1].Type != watch.Error {
				inner.Stop() // the server's close, after the events
			}
			var resumedAt atomic.Value
			resume := func(_ context.Context, rv string) (watch.Interface, error) {
				resumedAt.Store(rv)
				if tt.resumeErr != nil {
					return nil, tt.resumeErr
				}
				w := watch.NewFakeWithChanSize(1, false)
				w.Add(svcAt("z", "50"))
				return w, nil
			}
			w := newResumableWatch(context.Background(), inner, tt.opts, "test", resume, nil)
			defer w.Stop()
			var got []watch.EventType
			timeout := time.After(5 * time.Second)
			for len(got) < len(tt.want) {
				select {
				case ev, ok := <-w.ResultChan():
					if !ok {
						t.Fatalf("stream ended after %v, want %v", got, tt.want)
					}
					got = append(got, ev.Type)
				case <-timeout:
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("events %v, want %v", got, tt.want)
				}
			}
			if rv, _ := resumedAt.Load().(string); rv != tt.wantRV {
				t.Errorf("resumed from %q, want %q", rv, tt.wantRV)
			}
		})
	}
}

// TestResumableWatchStops: Stop ends the stream and the inner watch, also
// while an event waits to be read, and a resume waiting for the server.
func TestResumableWatchStops(t *testing.T) {
	inner := watch.NewFakeWithChanSize(1, false)
	inner.Add(svcAt("a", "2"))
	noResume := func(ctx context.Context, _ string) (watch.Interface, error) { <-ctx.Done(); return nil, ctx.Err() }
	w := newResumableWatch(context.Background(), inner, metav1.ListOptions{}, "test", noResume, nil)
	time.Sleep(10 * time.Millisecond) // the event waits on the result channel
	w.Stop()
	w.Stop() // twice is fine
	drained(t, w)
	if !inner.IsStopped() {
		t.Error("inner watch not stopped")
	}

	defer func(d time.Duration) { resumeEvery = d }(resumeEvery)
	resumeEvery = time.Millisecond
	lost := watch.NewFakeWithChanSize(1, false)
	lost.Stop() // ended: the resume waits for a server that does not come
	waiting := make(chan struct{})
	w = newResumableWatch(context.Background(), lost, metav1.ListOptions{}, "test", func(ctx context.Context, rv string) (watch.Interface, error) {
		close(waiting)
		<-ctx.Done()
		return nil, ctx.Err()
	}, nil)
	// Without a resourceVersion there is nothing to resume from: ended.
	drained(t, w)
	lost = watch.NewFakeWithChanSize(1, false)
	lost.Add(svcAt("a", "2"))
	lost.Stop()
	w = newResumableWatch(context.Background(), lost, metav1.ListOptions{}, "test", func(ctx context.Context, rv string) (watch.Interface, error) {
		close(waiting)
		<-ctx.Done()
		return nil, ctx.Err()
	}, nil)
	<-w.ResultChan()
	select {
	case <-waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("no resume")
	}
	w.Stop()
	drained(t, w)
}

func drained(t *testing.T, w watch.Interface) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-w.ResultChan():
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("result channel not closed")
		}
	}
}

func storeHas(s cache.Store, key string) bool {
	_, ok, _ := s.GetByKey(key)
	return ok
}

// TestReflectorRelistsInTheWatchAfterARestart: a resume that a restarted
// API server cannot serve (410: its history starts after our
// resourceVersion) streams every object again within the same watch, and
// the objects the reflector holds that the new stream lacks (deleted while
// the watch was away) are passed on as deleted: the reflector's store is
// the server's, with no list and no backoff. Handed the 410, the reflector
// slept its backoff before listing again, once more per restart, so that a
// few restarts in a row had changes seen up to a minute late.
func TestReflectorRelistsInTheWatchAfterARestart(t *testing.T) {
	defer func(d time.Duration) { resumeEvery = d }(resumeEvery)
	resumeEvery = 10 * time.Millisecond
	watchers := make(chan *watch.FakeWatcher, 8)
	var lists atomic.Int32
	var mu sync.Mutex
	var calls []metav1.ListOptions
	inner := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			lists.Add(1)
			return &v1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
		},
		WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			mu.Lock()
			calls = append(calls, o)
			mu.Unlock()
			w := watch.NewFakeWithChanSize(8, false)
			watchers <- w
			return w, nil
		},
	}
	p := newPatientListWatch(inner, newReadiness(func(context.Context) bool { return true }), "test")
	store, stop := runReflector(p)
	defer stop()

	first := <-watchers // the reflector's watch-list
	first.Add(svcAt("a", "5"))
	first.Add(svcAt("b", "6"))
	first.Action(watch.Bookmark, initialEventsEndAt("7"))
	first.Stop() // the server restarts
	began := time.Now()
	resumed := <-watchers
	gone := apierrors.NewResourceExpired("too old resource version: 7 (20)")
	resumed.Action(watch.Error, &gone.ErrStatus)
	var relist *watch.FakeWatcher
	select {
	case relist = <-watchers:
	case <-time.After(5 * time.Second):
		t.Fatal("no relist within 5 s of the 410")
	}
	relist.Add(svcAt("a", "15")) // b was deleted meanwhile; c created
	relist.Add(svcAt("c", "16"))
	relist.Action(watch.Bookmark, initialEventsEndAt("20"))
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && (storeHas(store, "ns/b") || !storeHas(store, "ns/c")) {
		time.Sleep(5 * time.Millisecond)
	}
	if storeHas(store, "ns/b") || !storeHas(store, "ns/c") || !storeHas(store, "ns/a") {
		t.Fatalf("store holds %v, want ns/a and ns/c (b deleted while the watch was away)", store.ListKeys())
	}
	if took := time.Since(began); took > 500*time.Millisecond || lists.Load() != 0 {
		t.Errorf("store right %v after the restart with %d lists, want at once, no list (no backoff)", took.Round(time.Millisecond), lists.Load())
	}
	obj, _, _ := store.GetByKey("ns/a")
	if rv := obj.(*v1.Service).ResourceVersion; rv != "15" {
		t.Errorf("ns/a at resourceVersion %s, want the relist's 15", rv)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 3 || calls[1].ResourceVersion != "7" || calls[1].SendInitialEvents != nil ||
		calls[2].SendInitialEvents == nil || !*calls[2].SendInitialEvents || calls[2].ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan {
		t.Errorf("watch calls %+v, want the watch-list, a resume from 7, a watch-list again", calls)
	}
	// The relisted watch goes on.
	relist.Delete(svcAt("a", "21"))
	deadline = time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && storeHas(store, "ns/a") {
		time.Sleep(5 * time.Millisecond)
	}
	if storeHas(store, "ns/a") {
		t.Error("a deletion after the relist was not passed on")
	}
}

// TestResumableWatchResumesBeforeItsFirstEvent: a plain watch (the
// reflector's after a list: no watch-list on the server or the client)
// whose stream ends before its first event (a restart or a cut within a
// minute of the list, in a quiet cluster: no bookmark yet) is resumed from
// the resourceVersion it began at. It was closed, and the reflector backed
// off before listing again.
func TestResumableWatchResumesBeforeItsFirstEvent(t *testing.T) {
	defer func(d time.Duration) { resumeEvery = d }(resumeEvery)
	resumeEvery = time.Millisecond
	inner := watch.NewFakeWithChanSize(1, false)
	inner.Stop()
	resumed := make(chan string, 1)
	w := newResumableWatch(context.Background(), inner, metav1.ListOptions{ResourceVersion: "7", AllowWatchBookmarks: true}, "test",
		func(_ context.Context, rv string) (watch.Interface, error) {
			resumed <- rv
			return watch.NewFakeWithChanSize(1, false), nil
		}, nil)
	defer w.Stop()
	select {
	case rv := <-resumed:
		if rv != "7" {
			t.Errorf("resumed from %q, want 7", rv)
		}
	case _, ok := <-w.ResultChan():
		t.Fatalf("stream ended (open %v) instead of a resume from 7", ok)
	case <-time.After(5 * time.Second):
		t.Fatal("no resume")
	}
}

// runReflector runs a reflector of Services over lw into a new store;
// stop ends it and waits for it (deferred by the test before it restores
// what its watches read, such as resumeEvery).
func runReflector(lw cache.ListerWatcher) (cache.Store, func()) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	r := cache.NewReflectorWithOptions(lw, &v1.Service{}, store, cache.ReflectorOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.RunWithContext(ctx); close(done) }()
	return store, func() { cancel(); <-done }
}

// TestLostStreamIsNotBlamedOnTheServer: a watch whose connection the client
// gave up (client-go's HTTP/2 health check) is resumed with a log line that
// says so; it said "an error on the server (...)", client-go's wrapping of
// the cause in its Status.
func TestLostStreamIsNotBlamedOnTheServer(t *testing.T) {
	logs := captureKlog(t)
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", "2")
	t.Cleanup(func() { _ = fs.Set("v", "0") })
	defer func(d time.Duration) { resumeEvery = d }(resumeEvery)
	resumeEvery = time.Millisecond

	first, second := watch.NewFake(), watch.NewFake()
	resume := func(context.Context, string) (watch.Interface, error) { return second, nil }
	w := newResumableWatch(context.Background(), first, metav1.ListOptions{ResourceVersion: "10"}, "services", resume, nil)
	defer w.Stop()
	lost := apierrors.NewClientErrorReporter(500, "GET", clientStreamFailure).
		AsObject(errors.New("unable to decode an event from the watch stream: http2: client connection lost"))
	go first.Action(watch.Error, lost)
	go second.Add(svcAt("a", "11"))
	if ev := <-w.ResultChan(); ev.Type != watch.Added {
		t.Fatalf("event %v after the resume, want the resumed stream's Added", ev.Type)
	}
	klog.Flush()
	got := logs.String()
	if !strings.Contains(got, `why="connection to the API server lost: unable to decode an event from the watch stream: http2: client connection lost"`) ||
		strings.Contains(got, "an error on the server") {
		t.Errorf("the resume's log line does not say the connection was lost:\n%s", got)
	}
}
