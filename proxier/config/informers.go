package config

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ProxyLabelSelector is kube-proxy's selector for Services and EndpointSlices: objects
// that name another service proxy, and the slices of headless Services, are not ours.
const ProxyLabelSelector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"

// DefaultConfigSyncPeriod is kube-proxy's --config-sync-period default.
const DefaultConfigSyncPeriod = 15 * time.Minute

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it
// is about to remove.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// NodeInfo is what the proxy needs to know about its own Node object.
type NodeInfo struct {
	Name string
	// Addresses are the node's InternalIPs followed by its ExternalIPs, in status order;
	// entries that are not IP addresses (hostnames) are left out.
	Addresses []netip.Addr
	// Zone is the topology.kubernetes.io/zone label, "" when unset.
	Zone string
	// Terminating is true once the Node has a deletionTimestamp, or the
	// cluster autoscaler's ToBeDeletedByClusterAutoscaler taint: kube-proxy
	// (KEP-3836) then fails /healthz, so load balancers drain the node
	// before it goes.
	Terminating bool
	// Deleted is true when the Node object is gone; the other fields then describe its
	// last known state.
	Deleted bool
}

// NodeHandler receives the state of the proxy's own Node. Calls are serialised with the
// Service and EndpointSlice calls of the same source.
type NodeHandler interface {
	// OnNodeChange is called with the Node's new state on every add, update and delete.
	OnNodeChange(node NodeInfo)
	// OnNodeSynced is called once, after the Node informer's initial list was delivered
	// (whether or not the Node exists).
	OnNodeSynced()
}

// InformerOptions configures an InformerSource.
type InformerOptions struct {
	// ConfigSyncPeriod is the informers' resync period (--config-sync-period);
	// 0 means DefaultConfigSyncPeriod.
	ConfigSyncPeriod time.Duration
	// NodeName is the Node to watch (--hostname-override or the hostname). When it is
	// empty, or NodeHandler is nil, no Node informer runs.
	NodeName    string
	NodeHandler NodeHandler
	// Unproxied delivers the ExternalName and headless Services too, as
	// the manifest source does, for a handler that says they are not
	// proxied (explain's plan); the proxy's handler has no use for them.
	Unproxied bool
}

// InformerSource feeds a Handler from an API server through shared informers, as
// kube-proxy does: Services and EndpointSlices filtered by ProxyLabelSelector, with
// ExternalName and headless Services left out (unless Unproxied), and the synced
// callbacks delivered only after both caches have synced, so that no rule is written from a partial view.
// While the API server is away, lists and watches wait for its /readyz, probed 250 ms
// after a failure and then at jittered waits doubling to 2-3 s (one stream of probes for
// the informers: readiness), instead of the reflectors' backoff to 30-60 s
// (patientListWatch), so changes are served within about 0.4 s of a short outage's end
// and 3 s of a long one's. The events one goroutine delivers, in order: those the
// informers hand over while it delivers the ones before, a burst (a resumed watch or a
// relist after an outage), reach a Batcher as one batch.
//
// Objects passed to the handlers belong to the informer caches: handlers must not modify
// them.
type InformerSource struct {
	client  kubernetes.Interface
	handler Handler
	opts    InformerOptions
	// ready tells whether the API server answers; nil: its /readyz.
	ready readyProbe
	// calls are the handler calls the informers handed over (each on its
	// own goroutine) and not yet delivered: one goroutine (deliverLoop)
	// delivers them, in order, so that the events that come while it
	// delivers the ones before are taken together (see deliverCalls).
	calls queuedCalls
	// listBatch: a batch of events (Batcher) is open for the slices of the
	// initial list; listed: that list was delivered (or Run ended), and no
	// initial list comes any more. Owned by the calls' delivery.
	listBatch, listed bool
	// nodeSeen: the Node informer delivered our Node at least once.
	nodeSeen atomic.Bool
	// nodeMissingAfter is how long after the Node informer's sync a Node
	// never seen is logged (nodeMissingLogAfter; tests shorten it).
	nodeMissingAfter time.Duration
}

// nodeMissingLogAfter is kube-proxy's wait for its Node to exist before it
// says it does not (30 s).
const nodeMissingLogAfter = 30 * time.Second

// NewInformerSource returns a source that will feed h from client once Run is called.
func NewInformerSource(client kubernetes.Interface, h Handler, opts InformerOptions) *InformerSource {
	if opts.ConfigSyncPeriod <= 0 {
		opts.ConfigSyncPeriod = DefaultConfigSyncPeriod
	}
	return &InformerSource{client: client, handler: h, opts: opts, nodeMissingAfter: nodeMissingLogAfter,
		calls: queuedCalls{queued: make(chan struct{}, 1)}}
}

// errNotSynced is what a NotSyncedError is (errors.Is).
var errNotSynced = errors.New("informer caches did not sync")

// NotSyncedError is Run's error when ctx ends before the caches synced. It
// wraps ctx's error (context.Canceled for a stop, DeadlineExceeded for a
// caller's deadline) so that a stop is told from a failure, and carries the
// last failed list or watch: a one-shot caller that gives up has nothing
// else to tell its user why.
type NotSyncedError struct {
	Cause error // ctx's cause
	Last  error // the last failed list or watch; nil when none failed
}

func (e *NotSyncedError) Error() string {
	msg := errNotSynced.Error() + ": " + e.Cause.Error()
	if e.Last != nil {
		msg += "; last API server error: " + e.Last.Error()
	}
	return msg
}

func (e *NotSyncedError) Unwrap() error        { return e.Cause }
func (e *NotSyncedError) Is(target error) bool { return target == errNotSynced }

// Run starts the informers, delivers the initial state followed by OnServiceSynced and
// OnEndpointSlicesSynced (and OnNodeSynced), then keeps delivering changes until ctx is
// done. It returns nil when ctx ends after the caches have synced, an error otherwise.
func (s *InformerSource) Run(ctx context.Context) error {
	ready := s.ready
	if ready == nil {
		ready = apiServerReady(s.client)
	}
	// One stream of probes for every informer (see readiness).
	probes := newReadiness(ready)
	proxyObjects := func(o *metav1.ListOptions) { o.LabelSelector = ProxyLabelSelector }
	factory := informers.NewSharedInformerFactory(s.client, s.opts.ConfigSyncPeriod)
	var last lastError
	services := serviceInformer(factory, s.client, probes, last.note, proxyObjects)
	slices := sliceInformer(factory, s.client, probes, last.note, proxyObjects)

	svcReg, err := services.AddEventHandlerWithResyncPeriod(serviceEvents{s}, s.opts.ConfigSyncPeriod)
	if err != nil {
		return fmt.Errorf("service informer: %w", err)
	}
	sliceReg, err := slices.AddEventHandlerWithResyncPeriod(sliceEvents{s}, s.opts.ConfigSyncPeriod)
	if err != nil {
		return fmt.Errorf("endpointslice informer: %w", err)
	}
	// Deferred first, so run last: once the informers have stopped, what
	// they handed over is delivered, and no handler call comes after Run.
	stopDelivery, delivered := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(delivered)
		s.deliverLoop(stopDelivery)
	}()
	defer func() {
		s.deliver(s.endListBatch) // Run failed before the sync: none stays open
		close(stopDelivery)
		<-delivered
	}()
	factories := []informers.SharedInformerFactory{factory}
	defer func() {
		for _, f := range factories {
			f.Shutdown()
		}
	}()

	var nodeSynced cache.InformerSynced
	if s.opts.NodeName != "" && s.opts.NodeHandler != nil {
		nodeFactory := informers.NewSharedInformerFactory(s.client, s.opts.ConfigSyncPeriod)
		thisNode := func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.opts.NodeName).String()
		}
		reg, err := nodeInformer(nodeFactory, s.client, probes, last.note, thisNode).
			AddEventHandlerWithResyncPeriod(nodeEvents{s}, s.opts.ConfigSyncPeriod)
		if err != nil {
			return fmt.Errorf("node informer: %w", err)
		}
		nodeSynced = reg.HasSynced
		factories = append(factories, nodeFactory)
	}

	for _, f := range factories {
		f.Start(ctx.Done())
	}
	// The registrations' HasSynced turn true only once our handlers have been given
	// every object of the initial lists, not merely once the stores are filled.
	// The slices' list ends its batch as soon as it was all delivered,
	// not at the sync, which waits for the Services' list too: the last
	// known state's Services, served meanwhile, take the slices listed.
	// First: WaitForCacheSync stops at the first that is not synced.
	slicesListed := func() bool {
		if !sliceReg.HasSynced() {
			return false
		}
		s.deliver(s.endListBatch)
		return true
	}
	if !waitSynced(ctx, "kube-userspace-proxy service config", slicesListed, svcReg.HasSynced) {
		return &NotSyncedError{Cause: context.Cause(ctx), Last: last.get()}
	}
	s.deliver(func() {
		s.handler.OnServiceSynced()
		s.handler.OnEndpointSlicesSynced()
	})
	if nodeSynced != nil {
		if !waitSynced(ctx, "kube-userspace-proxy node config", nodeSynced) {
			return &NotSyncedError{Cause: context.Cause(ctx), Last: last.get()}
		}
		s.deliver(s.opts.NodeHandler.OnNodeSynced)
		go s.logNodeMissing(ctx)
	}
	<-ctx.Done()
	klog.V(2).InfoS("Informer source stopping")
	return nil
}

// logNodeMissing says once, nodeMissingAfter after the Node informer's
// sync, that the proxy's Node has never been seen: a wrong
// --hostname-override silently turned zone hints off and /healthz to 503
// (nodeEligible false, as kube-proxy's), where kube-proxy says it timed out
// waiting for its Node. The line said the node counted as eligible, which
// was true before /healthz followed kube-proxy's.
func (s *InformerSource) logNodeMissing(ctx context.Context) {
	t := time.NewTimer(s.nodeMissingAfter)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	if !s.nodeSeen.Load() {
		klog.ErrorS(nil, "Timed out waiting for this proxy's Node object to exist: /healthz answers 503 (nodeEligible false) and zone topology hints are not used until it appears; check --hostname-override (else the host name is taken): it must be the Node's name (kubectl get nodes)",
			"node", s.opts.NodeName, "waited", s.nodeMissingAfter)
	}
}

// waitSynced is cache.WaitForNamedCacheSync without its "Unable to sync
// caches" error: a stop before the sync (Ctrl-C while the API server is
// away) is no error, and it was logged as one (logger="UnhandledError").
// The caller's error says why when it is one.
func waitSynced(ctx context.Context, what string, synced ...cache.InformerSynced) bool {
	klog.InfoS("Waiting for caches to sync", "controller", what)
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return false
	}
	klog.InfoS("Caches are synced", "controller", what)
	return true
}

// lastError keeps the last error of the informers' lists and watches.
type lastError struct {
	mu  sync.Mutex
	err error
}

func (l *lastError) note(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.err = err
}

func (l *lastError) get() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// initialSlice is called, in the calls' delivery, before a slice of the initial list
// is delivered: the first opens the list's batch. Until the sync nothing
// is served but the last known state's objects, which keep being served
// until the batch ends.
func (s *InformerSource) initialSlice() {
	if !s.listBatch && !s.listed {
		s.listBatch = true
		beginBatch(s.handler)
	}
}

// endListBatch ends the initial list's batch, in the calls' delivery, once the list was
// delivered: the slices listed are served, each Service merged once.
func (s *InformerSource) endListBatch() {
	s.listed = true
	if s.listBatch {
		s.listBatch = false
		endBatch(s.handler)
	}
}

// What a queued call delivers: a run of Service and EndpointSlice events
// with two slice events or more is one batch (deliverCalls).
const (
	otherCall = iota // a Node event, a synced call, a batch's end
	serviceCall
	sliceCall
)

type queuedCall struct {
	kind int
	call func()
}

// queuedCalls are the handler calls handed over and not yet delivered.
type queuedCalls struct {
	mu      sync.Mutex
	pending []queuedCall
	queued  chan struct{} // (capacity 1) wakes deliverLoop
}

// deliver hands one handler call over to the delivery loop.
func (s *InformerSource) deliver(call func()) { s.queue(otherCall, call) }

func (s *InformerSource) queue(kind int, call func()) {
	s.calls.mu.Lock()
	s.calls.pending = append(s.calls.pending, queuedCall{kind, call})
	s.calls.mu.Unlock()
	select {
	case s.calls.queued <- struct{}{}:
	default:
	}
}

// takeCalls takes every call handed over so far.
func (s *InformerSource) takeCalls() []queuedCall {
	s.calls.mu.Lock()
	defer s.calls.mu.Unlock()
	calls := s.calls.pending
	s.calls.pending = nil
	return calls
}

// deliverLoop delivers the calls handed over, in order, until stop is
// closed and none is left.
func (s *InformerSource) deliverLoop(stop <-chan struct{}) {
	for {
		if calls := s.takeCalls(); len(calls) > 0 {
			s.deliverCalls(calls)
			continue
		}
		select {
		case <-s.calls.queued:
		case <-stop:
			if calls := s.takeCalls(); len(calls) > 0 {
				s.deliverCalls(calls)
				continue
			}
			return
		}
	}
}

// deliverCalls delivers calls in order. Each run of Service and
// EndpointSlice events in them with two slice events or more is one batch
// (Batcher): the events that came while the ones before were delivered, a
// burst, as a resumed watch or a relist gives after an outage (every
// slice changed meanwhile, one by one), merge each Service's slices once
// instead of at every slice (5,000 one-endpoint slices of one Service
// changed during an outage: 63 s of CPU). An event that comes alone is
// delivered alone, at once. Other calls end a run: the synced calls come
// after the events before them are served. Until the initial list was
// delivered its own batch holds its slices (initialSlice).
func (s *InformerSource) deliverCalls(calls []queuedCall) {
	for len(calls) > 0 {
		n, slices := 1, 0
		if calls[0].kind != otherCall {
			for n = 0; n < len(calls) && calls[n].kind != otherCall; n++ {
				if calls[n].kind == sliceCall {
					slices++
				}
			}
		}
		batch := slices > 1 && s.listed
		if batch {
			beginBatch(s.handler)
		}
		for _, c := range calls[:n] {
			c.call()
		}
		if batch {
			endBatch(s.handler)
		}
		calls = calls[n:]
	}
}

// nodeInfo extracts the proxy's view of a Node.
func nodeInfo(node *v1.Node, deleted bool) NodeInfo {
	info := NodeInfo{
		Name: node.Name,
		Zone: node.Labels[v1.LabelTopologyZone],
		Terminating: node.DeletionTimestamp != nil || slices.ContainsFunc(node.Spec.Taints, func(t v1.Taint) bool {
			return t.Key == ToBeDeletedTaint
		}),
		Deleted: deleted,
	}
	if deleted {
		// kube-proxy's OnNodeDelete drops the node's labels: without a
		// zone, topology hints no longer narrow the endpoints.
		info.Zone = ""
	}
	for _, kind := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != kind {
				continue
			}
			if ip, ok := ParseObjectIP(a.Address); ok {
				info.Addresses = append(info.Addresses, ip)
			}
		}
	}
	return info
}

// ReadNode reads one Node once, as the proxy sees it. kube-proxy's
// NodeManager reads its node's IPs this way before it programs anything;
// the informer that follows the Node afterwards starts later.
func ReadNode(ctx context.Context, client kubernetes.Interface, name string) (NodeInfo, error) {
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return NodeInfo{}, err
	}
	return nodeInfo(node, false), nil
}
