package config

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
)

// LastKnownState stands between an API-server source and the proxier
// (--state-file). It passes every event on and keeps the Services and
// EndpointSlices they leave in a file; when a start's source has not synced
// within its grace (listed every Service and EndpointSlice: the API server
// is away, or slow, or refuses the lists), it serves that file's objects
// until the source syncs, however long that takes, then brings the proxier
// to the source's view.
//
// Why: this proxy is the data path. kube-proxy's rules live in the kernel
// and keep serving while kube-proxy restarts during an API server outage;
// a restarted userspace proxy had nothing to serve from until the API
// server answered, so every Service on the node failed for the rest of
// the outage. Kept on tmpfs (/run), the file lives exactly as long as
// kernel rules do: across a restart of the process, not a reboot of the
// node.
//
// Handler calls are serialised by the source; mu serialises them with
// Run, which hands next the file's objects and reads what is held.
type LastKnownState struct {
	path  string
	grace time.Duration
	// began is when the grace starts (GraceFrom); zero: at Run.
	began time.Time
	// writeEvery bounds how often changes are written: 10,000 small
	// Services and their slices are 6 MiB of JSON and 90 ms of CPU
	// (BenchmarkWriteStateFile10k).
	writeEvery time.Duration
	// next is the handler wrapped, to which batches of events go on
	// (Batcher); the file's objects and what the source's sync drops of
	// them go to it as batches of their own.
	next Handler

	mu           sync.Mutex
	services     kindState[*v1.Service]
	slices       kindState[*discovery.EndpointSlice]
	node         nodeShare
	bootstrapped bool          // the file's objects and the synced calls went to next
	synced       chan struct{} // closed once the source synced both kinds
	changed      chan struct{}

	// For the metrics (Status): serving the file's objects now, the last
	// good write (Unix ns, 0: none), failed writes.
	serving     atomic.Bool
	writtenAt   atomic.Int64
	writeErrors atomic.Int64
}

// StateStatus is what LastKnownState reports for the metrics.
type StateStatus struct {
	// Serving: the proxier holds the file's objects (the source has not
	// synced since the start).
	Serving bool
	// Written is the last good write of the file (zero: none yet).
	Written time.Time
	// WriteErrors counts failed writes.
	WriteErrors int64
}

// Status is the state of the file and of what is served from it.
func (s *LastKnownState) Status() StateStatus {
	st := StateStatus{Serving: s.serving.Load(), WriteErrors: s.writeErrors.Load()}
	if ns := s.writtenAt.Load(); ns != 0 {
		st.Written = time.Unix(0, ns)
	}
	return st
}

// kindState is one kind's share of LastKnownState, under its mu.
type kindState[T metav1.Object] struct {
	held map[string]T
	// deleted holds the keys the source deleted before it synced: the
	// file, older, must not bring them back (nil once it cannot).
	deleted map[string]struct{}
	// provisional holds what was served from the file and the source
	// has not delivered yet: left over at the source's sync, it is gone.
	provisional map[string]T
	synced      bool // the source synced this kind
	next        kindHandler[T]
}

// kindHandler is one kind's methods of the next Handler.
type kindHandler[T any] struct {
	add        func(T)
	update     func(old, cur T)
	del        func(T)
	markSynced func()
}

func newKindState[T metav1.Object](next kindHandler[T]) kindState[T] {
	return kindState[T]{held: map[string]T{}, deleted: map[string]struct{}{}, next: next}
}

func objKey(o metav1.Object) string { return o.GetNamespace() + "/" + o.GetName() }

// changed passes on an add (hadOld false) or update; the file's version,
// if it was served, is what cur replaces.
func (k *kindState[T]) changed(old T, hadOld bool, cur T) {
	key := objKey(cur)
	k.held[key] = cur
	if prov, ok := k.provisional[key]; ok {
		delete(k.provisional, key)
		k.next.update(prov, cur)
		return
	}
	if !hadOld {
		k.next.add(cur)
		return
	}
	k.next.update(old, cur)
}

func (k *kindState[T]) gone(obj T) {
	key := objKey(obj)
	delete(k.held, key)
	if k.deleted != nil {
		k.deleted[key] = struct{}{}
	}
	k.next.del(obj)
}

// sourceSynced notes the source's synced call, passed on unless the file's
// objects went with one already.
func (k *kindState[T]) sourceSynced(bootstrapped bool) {
	k.synced = true
	k.deleted = nil
	if !bootstrapped {
		k.next.markSynced()
	}
}

// serve hands next the file's objects the source has neither delivered
// nor deleted.
func (k *kindState[T]) serve(fromFile []T) {
	k.provisional = map[string]T{}
	for _, o := range fromFile {
		key := objKey(o)
		_, held := k.held[key]
		if _, deleted := k.deleted[key]; !held && !deleted {
			k.provisional[key] = o
			k.next.add(o)
		}
	}
	k.deleted = nil
}

// dropProvisional deletes what the file served and the source does not
// hold, and says how many.
func (k *kindState[T]) dropProvisional() int {
	n := len(k.provisional)
	for _, key := range slices.Sorted(maps.Keys(k.provisional)) {
		k.next.del(k.provisional[key])
	}
	k.provisional = nil
	return n
}

func (k *kindState[T]) snapshot() []T { return slices.Collect(maps.Values(k.held)) }

// nodeShare is the Node's share of LastKnownState, under its mu: its zone,
// so that topology hints keep routing within it while the file is served
// (an unknown zone uses every endpoint, so a restart during an outage
// would have sent the node's traffic to other zones).
type nodeShare struct {
	name string // this node's; a file written under another name is not used
	next NodeHandler
	// zone is the last zone the source gave; known once it gave one.
	zone  string
	known bool
	// addrs are the Node's addresses as the source last gave them, kept
	// in the file so that a start during an outage takes the node IPs
	// the Node had (ReadStateNode), not the default route's.
	addrs []netip.Addr
	// provisional: the file's zone went to next and the source has
	// given none since.
	provisional bool
	// synced: the source's Node informer listed (its view, Node or none,
	// is the truth from then on).
	synced bool
}

// stateNodes is LastKnownState's NodeHandler (Nodes).
type stateNodes struct{ s *LastKnownState }

// Nodes wraps next, the handler of this node's Node object (name), so
// that the file keeps the Node's zone and a start that serves the file
// hands it to next until the source's Node informer gives its own.
func (s *LastKnownState) Nodes(name string, next NodeHandler) NodeHandler {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.node = nodeShare{name: name, next: next}
	return stateNodes{s}
}

func (n stateNodes) OnNodeChange(info NodeInfo) {
	s := n.s
	s.mu.Lock()
	defer s.mu.Unlock()
	zone, addrs := info.Zone, info.Addresses
	if info.Deleted {
		zone, addrs = "", nil
	}
	if !s.node.known || zone != s.node.zone || !slices.Equal(addrs, s.node.addrs) {
		s.noteChange()
	}
	s.node.zone, s.node.addrs, s.node.known, s.node.provisional = zone, addrs, true, false
	s.node.next.OnNodeChange(info)
}

func (n stateNodes) OnNodeSynced() {
	s := n.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.node.synced = true
	if s.node.provisional {
		// The informer listed no Node of this name: the file's zone goes
		// too (as a Node that never appears means no zone), and the Node
		// is gone (Deleted: /healthz's nodeEligible is false).
		s.node.provisional = false
		s.node.next.OnNodeChange(NodeInfo{Name: s.node.name, Deleted: true})
	}
	s.node.next.OnNodeSynced()
}

// serve hands next the file's zone, unless the source gave one already
// or listed no Node, or the file was written for another node; it returns
// the zone served.
func (n *nodeShare) serve(state State) string {
	if n.next == nil || n.known || n.synced || state.Zone == "" || state.Node != n.name {
		return ""
	}
	n.provisional = true
	n.next.OnNodeChange(NodeInfo{Name: n.name, Zone: state.Zone})
	return state.Zone
}

// DefaultStateFileGrace is how long a start waits for the API server
// before it serves the last known state.
const DefaultStateFileGrace = 2 * time.Second

// stateWriteEvery is the least time between two writes of the file.
const stateWriteEvery = 10 * time.Second

// NewLastKnownState wraps next: pass it to the source as its handler and
// call Run. grace < 0 means DefaultStateFileGrace.
func NewLastKnownState(path string, next Handler, grace time.Duration) *LastKnownState {
	if grace < 0 {
		grace = DefaultStateFileGrace
	}
	return &LastKnownState{
		path: path, grace: grace, writeEvery: stateWriteEvery, next: next,
		services: newKindState(kindHandler[*v1.Service]{
			next.OnServiceAdd, next.OnServiceUpdate, next.OnServiceDelete, next.OnServiceSynced}),
		slices: newKindState(kindHandler[*discovery.EndpointSlice]{
			next.OnEndpointSliceAdd, next.OnEndpointSliceUpdate, next.OnEndpointSliceDelete, next.OnEndpointSlicesSynced}),
		synced: make(chan struct{}), changed: make(chan struct{}, 1),
	}
}

// GraceFrom makes the grace count from t, the process's start, instead of
// from Run: what ran before (the read of the Node, which waits up to 2 s
// for an API server that does not answer) is part of the wait, not added
// to it.
func (s *LastKnownState) GraceFrom(t time.Time) { s.began = t }

// Run serves the file if the source has not synced within the grace, then
// writes the file after changes (at most every writeEvery) and once more
// when ctx ends, before it returns. Nothing is written before the source
// synced: a partial view must not replace the last full one.
func (s *LastKnownState) Run(ctx context.Context) {
	removeStaleTemps(s.path)
	wait := s.grace
	if !s.began.IsZero() {
		wait = max(0, s.grace-time.Since(s.began))
	}
	grace := time.NewTimer(wait)
	defer grace.Stop()
	for waiting := true; waiting; {
		select {
		case <-s.synced:
			waiting = false
		case <-grace.C:
			s.bootstrap()
		case <-ctx.Done():
			// A stop just after the sync (both ready, select chose
			// this) still writes what the source gave.
			select {
			case <-s.synced:
				s.write()
			default:
			}
			return
		}
	}
	// One write per writeEvery at most; what changes meanwhile goes with
	// the next. The sync's write takes the first token.
	pace := flowcontrol.NewTokenBucketRateLimiter(float32(1/s.writeEvery.Seconds()), 1)
	pace.Accept()
	for {
		s.write()
		select {
		case <-ctx.Done():
			s.write()
			return
		case <-s.changed:
		}
		if pace.Wait(ctx) != nil {
			s.write()
			return
		}
	}
}

// bootstrap hands next the file's objects the source has not delivered
// yet, and the synced calls, so that the proxier serves them.
func (s *LastKnownState) bootstrap() {
	state, err := ReadStateFile(s.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		klog.InfoS("No Services and EndpointSlices from the API server yet (it is away, slow, or refuses the reads: see its lines) and no last known state to serve meanwhile", "stateFile", s.path, "waited", s.grace)
		return
	case err != nil:
		klog.ErrorS(err, "No Services and EndpointSlices from the API server yet, and the last known state cannot be read: nothing is served until the API server gives them", "stateFile", s.path)
		return
	}
	for _, err := range state.Skipped {
		klog.ErrorS(err, "Not serving an invalid object of the last known state", "stateFile", s.path)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.services.synced || s.slices.synced {
		// The source synced meanwhile: it makes both calls at once, so
		// the other kind is on its way (the file would add stale
		// objects for a moment).
		return
	}
	s.bootstrapped = true
	s.serving.Store(true)
	// The zone first, so that the first sync routes by it; then every
	// object, then the synced calls, as a source delivers them.
	zone := s.node.serve(state)
	beginBatch(s.next)
	s.services.serve(state.Services)
	s.slices.serve(state.EndpointSlices)
	endBatch(s.next)
	s.services.next.markSynced()
	s.slices.next.markSynced()
	klog.InfoS("No Services and EndpointSlices from the API server yet: serving the last known state until it gives them", "stateFile", s.path,
		"written", state.Written.Format(time.RFC3339), "age", time.Since(state.Written).Round(time.Second),
		"services", len(state.Services), "endpointSlices", len(state.EndpointSlices), "zone", zone)
}

func (s *LastKnownState) noteChange() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *LastKnownState) OnServiceAdd(svc *v1.Service) { s.OnServiceUpdate(nil, svc) }

func (s *LastKnownState) OnServiceUpdate(old, svc *v1.Service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.services.changed(old, old != nil, svc)
	s.noteChange()
}

func (s *LastKnownState) OnServiceDelete(svc *v1.Service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.services.gone(svc)
	s.noteChange()
}

func (s *LastKnownState) OnServiceSynced() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.services.sourceSynced(s.bootstrapped)
	s.sourceSynced()
}

func (s *LastKnownState) OnEndpointSliceAdd(es *discovery.EndpointSlice) {
	s.OnEndpointSliceUpdate(nil, es)
}

func (s *LastKnownState) OnEndpointSliceUpdate(old, es *discovery.EndpointSlice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slices.changed(old, old != nil, es)
	s.noteChange()
}

func (s *LastKnownState) OnEndpointSliceDelete(es *discovery.EndpointSlice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slices.gone(es)
	s.noteChange()
}

// BeginBatch and EndBatch pass a source's batch of events on to next
// (Batcher).
func (s *LastKnownState) BeginBatch() { beginBatch(s.next) }
func (s *LastKnownState) EndBatch()   { endBatch(s.next) }

func (s *LastKnownState) OnEndpointSlicesSynced() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slices.sourceSynced(s.bootstrapped)
	s.sourceSynced()
}

// sourceSynced runs under mu after each synced call: once the source has
// synced both kinds, what the file served and the source does not hold
// is deleted, and Run may write.
func (s *LastKnownState) sourceSynced() {
	if !s.services.synced || !s.slices.synced {
		return
	}
	if s.bootstrapped {
		beginBatch(s.next)
		slicesGone := s.slices.dropProvisional()
		servicesGone := s.services.dropProvisional()
		endBatch(s.next)
		s.serving.Store(false)
		klog.InfoS("The API server answered: its state replaced the last known state", "servicesGone", servicesGone, "endpointSlicesGone", slicesGone)
	}
	close(s.synced)
}

// write replaces the file with the objects held now; a failure is logged
// and the next change tries again.
func (s *LastKnownState) write() {
	s.mu.Lock()
	state := State{Written: time.Now(), Services: s.services.snapshot(), EndpointSlices: s.slices.snapshot()}
	if s.node.known {
		state.Node, state.Zone, state.NodeIPs = s.node.name, s.node.zone, s.node.addrs
	}
	s.mu.Unlock()
	if err := WriteStateFile(s.path, state); err != nil {
		s.writeErrors.Add(1)
		klog.ErrorS(err, "Cannot write the last known state: a start during an API server outage would serve an older one, or none", "stateFile", s.path)
		s.noteChange() // tried again after writeEvery, changes or not
		return
	}
	s.writtenAt.Store(state.Written.UnixNano())
}
