package config

import (
	"context"
	"fmt"
	"maps"
	"math/rand"
	"os"
	goruntime "runtime"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// fakeAPI is a small model of kube-apiserver's watch cache for Services:
// a resourceVersion counter, the objects, the event history from oldest on
// (a watch from an older resourceVersion gets 410), watch-list streams
// (sendInitialEvents: every object, then the initial-events-end bookmark)
// and plain watches, and faults (streams cut or closed, restarts, 429).
type fakeAPI struct {
	mu      sync.Mutex
	rv      int
	objs    map[string]*v1.Service
	log     []watch.Event
	logRV   []int
	oldest  int
	streams map[*fakeStream]bool
	notify  chan struct{}
	// faults for the next watch calls (consumed in order)
	nextErr   []error
	nextCutAt []int // a stream cut (client stream failure) after this many events, -1 none
	calls     []metav1.ListOptions
	lists     int
	// quiet: changes are not streamed (as in an outage, the streams end
	// before they are told)
	quiet bool
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{rv: 1, objs: map[string]*v1.Service{}, streams: map[*fakeStream]bool{}, notify: make(chan struct{}), oldest: 1}
}

func (f *fakeAPI) changed() {
	close(f.notify)
	f.notify = make(chan struct{})
}

func (f *fakeAPI) mutate(kind int, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	key := "ns/" + name
	s := svcAt(name, strconv.Itoa(f.rv))
	old, exists := f.objs[key]
	switch {
	case kind == 2 && exists:
		delete(f.objs, key)
		d := old.DeepCopy()
		d.ResourceVersion = strconv.Itoa(f.rv)
		f.log = append(f.log, watch.Event{Type: watch.Deleted, Object: d})
	case exists:
		f.objs[key] = s
		f.log = append(f.log, watch.Event{Type: watch.Modified, Object: s.DeepCopy()})
	default:
		f.objs[key] = s
		f.log = append(f.log, watch.Event{Type: watch.Added, Object: s.DeepCopy()})
	}
	f.logRV = append(f.logRV, f.rv)
	if !f.quiet {
		f.changed()
	}
}

// restart ends every stream (closed by the server) and forgets the history.
func (f *fakeAPI) restart() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.oldest = f.rv
	for s := range f.streams {
		s.end(false)
	}
}

// bookmark appends a bookmark at the current resourceVersion.
func (f *fakeAPI) bookmark() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, watch.Event{Type: watch.Bookmark, Object: &v1.Service{ObjectMeta: metav1.ObjectMeta{ResourceVersion: strconv.Itoa(f.rv)}}})
	f.logRV = append(f.logRV, f.rv)
	f.changed()
}

// closeAll ends every stream (closed by the server) and keeps the history.
func (f *fakeAPI) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.streams {
		s.end(false)
	}
}

// cut breaks every stream on the client's side.
func (f *fakeAPI) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.streams {
		s.end(true)
	}
}

func (f *fakeAPI) state() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := map[string]string{}
	for k, o := range f.objs {
		m[k] = o.ResourceVersion
	}
	return m
}

func (f *fakeAPI) list(_ context.Context, _ metav1.ListOptions) (runtime.Object, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	l := &v1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(f.rv)}}
	for _, o := range f.objs {
		l.Items = append(l.Items, *o.DeepCopy())
	}
	return l, nil
}

func (f *fakeAPI) watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, o)
	if len(f.nextErr) > 0 {
		err := f.nextErr[0]
		f.nextErr = f.nextErr[1:]
		if err != nil {
			return nil, err
		}
	}
	cutAt := -1
	if len(f.nextCutAt) > 0 {
		cutAt = f.nextCutAt[0]
		f.nextCutAt = f.nextCutAt[1:]
	}
	s := &fakeStream{f: f, result: make(chan watch.Event), stop: make(chan struct{}), ended: make(chan bool, 1), cutAt: cutAt}
	var pre []watch.Event
	pos := len(f.log)
	if o.SendInitialEvents != nil && *o.SendInitialEvents {
		keys := make([]string, 0, len(f.objs))
		for k := range f.objs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			pre = append(pre, watch.Event{Type: watch.Added, Object: f.objs[k].DeepCopy()})
		}
		pre = append(pre, watch.Event{Type: watch.Bookmark, Object: initialEventsEndAt(strconv.Itoa(f.rv))})
	} else {
		from, err := strconv.Atoi(o.ResourceVersion)
		if err != nil {
			from = f.rv
		}
		if from < f.oldest {
			gone := apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", from, f.oldest))
			pre = append(pre, watch.Event{Type: watch.Error, Object: &gone.ErrStatus})
			s.errOnly = true
		} else {
			pos = sort.SearchInts(f.logRV, from+1)
		}
	}
	f.streams[s] = true
	go s.run(ctx, pre, pos)
	return s, nil
}

type fakeStream struct {
	f        *fakeAPI
	result   chan watch.Event
	stop     chan struct{}
	stopOnce sync.Once
	ended    chan bool // true: cut (client failure), false: closed
	cutAt    int
	errOnly  bool
}

func (s *fakeStream) end(lost bool) {
	select {
	case s.ended <- lost:
	default:
	}
}

func (s *fakeStream) ResultChan() <-chan watch.Event { return s.result }
func (s *fakeStream) Stop()                          { s.stopOnce.Do(func() { close(s.stop) }) }

func (s *fakeStream) run(ctx context.Context, pre []watch.Event, pos int) {
	defer close(s.result)
	defer func() {
		s.f.mu.Lock()
		delete(s.f.streams, s)
		s.f.mu.Unlock()
	}()
	sent := 0
	send := func(ev watch.Event) bool {
		if s.cutAt >= 0 && sent >= s.cutAt {
			s.cutAt = -1
			s.end(true)
			return false
		}
		select {
		case lost := <-s.ended:
			if lost {
				lostEv := streamLost()
				select {
				case s.result <- lostEv:
				case <-s.stop:
				}
			}
			return false
		case <-s.stop:
			return false
		case <-ctx.Done():
			return false
		case s.result <- ev:
			sent++
			return true
		}
	}
	for _, ev := range pre {
		if !send(ev) {
			s.drainEnd()
			return
		}
	}
	if s.errOnly {
		return
	}
	for {
		s.f.mu.Lock()
		evs := append([]watch.Event(nil), s.f.log[pos:]...)
		pos = len(s.f.log)
		ch := s.f.notify
		s.f.mu.Unlock()
		for _, ev := range evs {
			if !send(ev) {
				s.drainEnd()
				return
			}
		}
		select {
		case lost := <-s.ended:
			s.endWith(lost)
			return
		case <-s.stop:
			return
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// drainEnd sends the lost-stream error of a cut decided in send.
func (s *fakeStream) drainEnd() {
	select {
	case lost := <-s.ended:
		s.endWith(lost)
	default:
	}
}

// endWith ends the stream as a cut decided: lost, with the lost-stream
// error; else closed.
func (s *fakeStream) endWith(lost bool) {
	if lost {
		select {
		case s.result <- streamLost():
		case <-s.stop:
		}
	}
}

type unsupportedLW struct{ *cache.ListWatch }

func (unsupportedLW) IsWatchListSemanticsUnSupported() bool { return true }

func storeState(s cache.Store) map[string]string {
	m := map[string]string{}
	for _, o := range s.List() {
		svc := o.(*v1.Service)
		m[svc.Namespace+"/"+svc.Name] = svc.ResourceVersion
	}
	return m
}

// TestInformerModel drives a real client-go reflector over a
// patientListWatch of fakeAPI through random changes and faults (streams
// cut or closed, API-server restarts that make every resume a 410, calls
// answered 429 or 410, streams cut after a few events, bookmarks), in
// watch-list mode and in plain list+watch mode (a server or client without
// watch-list): the store must end equal to the server's objects, and every
// goroutine must end with the reflector. KUP_INFORMER_MODEL_SEEDS=N runs N
// seeds per mode from KUP_INFORMER_MODEL_FIRST (the sweep that wrote it ran
// 50 and 40 of them).
func TestInformerModel(t *testing.T) {
	defer func(d time.Duration) { resumeEvery = d }(resumeEvery)
	resumeEvery = 5 * time.Millisecond
	seeds := 3
	if testing.Short() {
		seeds = 1
	}
	if s := os.Getenv("KUP_INFORMER_MODEL_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	first := 0
	if s := os.Getenv("KUP_INFORMER_MODEL_FIRST"); s != "" {
		first, _ = strconv.Atoi(s)
	}
	for _, mode := range []string{"watchlist", "list"} {
		for seed := first; seed < first+seeds; seed++ {
			t.Run(fmt.Sprintf("%s-%d", mode, seed), func(t *testing.T) {
				modelRun(t, mode, int64(seed))
			})
		}
	}
}

func modelRun(t *testing.T, mode string, seed int64) {
	rnd := rand.New(rand.NewSource(seed))
	before := goruntime.NumGoroutine()
	defer func() {
		deadline := time.Now().Add(5 * time.Second)
		for goruntime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := goruntime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			t.Errorf("goroutines %d after the stop, %d before:\n%s", n, before, buf[:goruntime.Stack(buf, true)])
		}
	}()
	f := newFakeAPI()
	for i := 0; i < 4; i++ {
		f.mutate(0, fmt.Sprintf("s%d", i))
	}
	var lw cache.ListerWatcher = &cache.ListWatch{ListWithContextFunc: f.list, WatchFuncWithContext: f.watch}
	if mode == "list" {
		lw = unsupportedLW{lw.(*cache.ListWatch)}
	}
	p := newPatientListWatch(lw, newReadiness(func(context.Context) bool { return true }), "test")
	store, stop := runReflector(p)
	defer stop()
	var ops []string
	for step := 0; step < 60; step++ {
		switch x := rnd.Intn(100); {
		case x < 55:
			k := rnd.Intn(3)
			name := fmt.Sprintf("s%d", rnd.Intn(8))
			f.mutate(k, name)
			ops = append(ops, fmt.Sprintf("m%d:%s", k, name))
		case x < 65:
			f.cut()
			ops = append(ops, "cut")
		case x < 75:
			f.restart()
			ops = append(ops, "restart")
		case x < 82:
			f.mu.Lock()
			f.nextErr = append(f.nextErr, apierrors.NewTooManyRequests("slow down", 0))
			f.mu.Unlock()
			ops = append(ops, "429")
		case x < 92:
			n := rnd.Intn(4)
			f.mu.Lock()
			f.nextCutAt = append(f.nextCutAt, n)
			f.mu.Unlock()
			ops = append(ops, fmt.Sprintf("cutat%d", n))
		case x < 95:
			f.bookmark()
			ops = append(ops, "bm")
		case x < 97:
			f.closeAll()
			ops = append(ops, "close")
		default:
			f.mu.Lock()
			f.nextErr = append(f.nextErr, apierrors.NewResourceExpired("too old"))
			f.mu.Unlock()
			ops = append(ops, "410call")
		}
		time.Sleep(time.Duration(rnd.Intn(4)) * time.Millisecond)
	}
	f.mu.Lock()
	f.nextErr, f.nextCutAt = nil, nil
	f.mu.Unlock()
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) {
		if maps.Equal(storeState(store), f.state()) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.mu.Lock()
	calls := len(f.calls)
	lists := f.lists
	f.mu.Unlock()
	t.Errorf("seed %d: store %v, server %v (after %d watch calls, %d lists); ops %v", seed, storeState(store), f.state(), calls, lists, ops)
}

// TestRelistCutShortThenThrottled: a relist of resumableWatch (after a
// restarted API server's 410) passes objects on at their own
// resourceVersions, which the reflector takes as its own; cut after its
// first object, and its new start answered 429 (API Priority and Fairness
// throttles the clients that all relist after a restart), the 429 handed to
// the reflector made it sleep and watch again, without a list, from that
// object's resourceVersion, older than the deletion the relist was to find:
// the deleted Service stayed in the store for good.
func TestRelistCutShortThenThrottled(t *testing.T) {
	defer func(d time.Duration) { resumeEvery = d }(resumeEvery)
	resumeEvery = 5 * time.Millisecond
	f := newFakeAPI()
	f.mutate(0, "a") // 2
	f.mutate(0, "b") // 3
	f.mutate(0, "c") // 4
	p := newPatientListWatch(&cache.ListWatch{ListWithContextFunc: f.list, WatchFuncWithContext: f.watch}, newReadiness(func(context.Context) bool { return true }), "test")
	store, stop := runReflector(p)
	defer stop()
	for !maps.Equal(storeState(store), f.state()) {
		time.Sleep(5 * time.Millisecond)
	}
	f.mu.Lock()
	f.nextCutAt = []int{-1, 1}                                                  // the resume; the relist, cut after a
	f.nextErr = []error{nil, nil, apierrors.NewTooManyRequests("slow down", 1)} // the relist's new start
	f.mu.Unlock()
	f.mu.Lock()
	f.quiet = true // away: not streamed
	f.mu.Unlock()
	f.mutate(2, "b") // 5: deleted while away
	f.mutate(1, "a") // 6
	f.restart()      // history from 6 on
	f.mu.Lock()
	f.quiet = false
	f.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && !maps.Equal(storeState(store), f.state()) {
		time.Sleep(20 * time.Millisecond)
	}
	f.mu.Lock()
	var calls []string
	for _, c := range f.calls {
		calls = append(calls, fmt.Sprintf("rv=%s sie=%v", c.ResourceVersion, c.SendInitialEvents != nil))
	}
	f.mu.Unlock()
	if !maps.Equal(storeState(store), f.state()) {
		t.Errorf("store %v, server %v; watch calls %q, lists %d", storeState(store), f.state(), calls, f.lists)
	}
}
