package config

import (
	"context"
	"errors"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// clientStreamFailure is the cause client-go's StreamWatcher gives the Error
// event it makes of a watch stream that broke on the client's side (the
// connection aborted, an HTTP/2 ping unanswered): "unable to decode an event
// from the watch stream: ...".
const clientStreamFailure = "ClientWatchDecoding"

// resumeEvery spaces the resumes of one watch: a server that ends every
// stream at once is not asked again in a loop (tests shorten it; each
// watch reads it once, when it is made, so that a test's restore does not
// race with the watches of a reflector it stopped, which end on their own).
var resumeEvery = time.Second

// resumableWatch is the watch patientListWatch gives the reflector. When the
// stream under it ends (the server closed it, or its connection broke) it
// watches again from the last resourceVersion it passed on, through
// patientListWatch (which waits for the API server), and goes on: the
// reflector does not see the end. Seen by the reflector, an end made it
// return to ListAndWatch and sleep its backoff before listing everything
// again (a broken connection is an error to it, and so is a stream the
// server ends within a second, as one does right after its restart); that
// backoff doubles with every outage less than two minutes after the last
// (800 ms up to 30 s, each stretched by up to 2x) and no option of a shared
// informer sets it: after a few short outages in a row, changes were seen up
// to a minute after the API server answered again.
//
// A resume the server cannot serve (410: its history no longer reaches
// that resourceVersion, as after its restart) is answered here too when the
// watch began as a watch-list, so that every object it passed on was seen:
// every object is streamed again (relist), passed on, and those passed on
// before that the new stream lacks are passed on as deleted. Otherwise
// (the first state came from a list this watch did not see), and for any
// other error, the reflector is handed the error and lists again.
//
// A stream opened with sendInitialEvents (client-go's watch-list) is passed
// on as is until its initial-events-end bookmark: an initial list cut short
// cannot be resumed, the reflector must start it over.
type resumableWatch struct {
	what           string
	every          time.Duration // resumeEvery
	resume, relist func(ctx context.Context, rv string) (watch.Interface, error)
	ctx            context.Context
	cancel         context.CancelFunc

	// Owned by run: the last resourceVersion passed on; whether a stream's
	// initial events are being passed on (initial), ours (relisting, with
	// the keys they held in seen); the objects passed on (known, nil when
	// the watch did not begin as a watch-list: then the initial state came
	// from a list this watch did not see, and a 410 is the reflector's);
	// the 410 to hand on when no relist can be made.
	lastRV             string
	initial, relisting bool
	seen               map[string]bool
	known              map[string]runtime.Object
	expired            runtime.Object

	result   chan watch.Event
	stop     chan struct{}
	stopOnce sync.Once
	mu       sync.Mutex // guards inner, which run replaces at a resume
	inner    watch.Interface
}

func newResumableWatch(ctx context.Context, inner watch.Interface, opts metav1.ListOptions, what string,
	resume, relist func(ctx context.Context, rv string) (watch.Interface, error)) *resumableWatch {
	w := &resumableWatch{what: what, every: resumeEvery, resume: resume, relist: relist, inner: inner, result: make(chan watch.Event), stop: make(chan struct{})}
	w.ctx, w.cancel = context.WithCancel(ctx)
	w.initial = opts.SendInitialEvents != nil && *opts.SendInitialEvents
	if rv := opts.ResourceVersion; !w.initial && rv != "" && rv != "0" {
		// A watch from a list's resourceVersion: a stream that ends before
		// its first event is resumed from there too ("" and "0" begin with
		// every object, unordered: nothing to resume from).
		w.lastRV = rv
	}
	if w.initial && relist != nil {
		w.known = map[string]runtime.Object{}
	}
	go w.run(inner)
	return w
}

func (w *resumableWatch) ResultChan() <-chan watch.Event { return w.result }

func (w *resumableWatch) Stop() {
	w.stopOnce.Do(func() {
		close(w.stop)
		w.cancel()
		w.mu.Lock()
		w.inner.Stop()
		w.mu.Unlock()
	})
}

// send passes ev on; false when the watch was stopped.
func (w *resumableWatch) send(ev watch.Event) bool {
	select {
	case <-w.stop:
		return false
	case w.result <- ev:
		return true
	}
}

// How a stream ended (pass).
const (
	endStopped = "stopped" // by Stop
	endClosed  = "closed"  // by the server
	endLost    = "lost"    // broken on our side
	endExpired = "expired" // 410: the server's history no longer reaches our resourceVersion
	endHanded  = "handed"  // a server's error, handed to the reflector
)

func (w *resumableWatch) run(inner watch.Interface) {
	defer close(w.result)
	defer w.cancel()
	began := time.Now()
	for {
		end, why := w.pass(inner)
		inner.Stop()
		var next func(ctx context.Context, rv string) (watch.Interface, error)
		switch {
		case end == endExpired && w.known != nil:
			next = w.relist // also a relist that expired: start it over
		case (end == endClosed || end == endLost) && w.relisting:
			next = w.relist // a relist cut short: start it over
		case (end == endClosed || end == endLost) && !w.initial && w.lastRV != "":
			next = w.resume
		default:
			if end == endExpired {
				w.send(watch.Event{Type: watch.Error, Object: w.expired})
			}
			return
		}
		relisting := next != nil && w.known != nil && (end == endExpired || w.relisting)
		if relisting {
			klog.V(2).InfoS("Watch could not be resumed; streaming every object again from the API server", "informer", w.what, "resourceVersion", w.lastRV, "why", why)
		} else {
			klog.V(2).InfoS("Watch stream ended; watching again from the last resourceVersion", "informer", w.what, "resourceVersion", w.lastRV, "why", why)
		}
		// A 410 is answered at once: the stream that told it was the first
		// of its resume, and the relist's stream starts at the server's now.
		if wait := w.every - time.Since(began); wait > 0 && end != endExpired {
			select {
			case <-w.stop:
				return
			case <-time.After(wait):
			}
		}
		n, err := next(w.ctx, w.lastRV)
		if err != nil && w.known != nil && !relisting && (apierrors.IsResourceExpired(err) || apierrors.IsGone(err)) {
			relisting = true
			n, err = w.relist(w.ctx, w.lastRV)
		}
		if err != nil {
			if w.ctx.Err() == nil {
				w.relisting = w.relisting || relisting // see handed
				w.send(w.handed(statusOf(err)))
			}
			return
		}
		if relisting {
			w.initial, w.relisting, w.seen = true, true, map[string]bool{}
		}
		w.mu.Lock()
		select {
		case <-w.stop:
			w.mu.Unlock()
			n.Stop()
			return
		default:
		}
		w.inner, inner = n, n
		w.mu.Unlock()
		began = time.Now()
	}
}

// pass passes inner's events on until its stream ends, and says how it
// ended and why. It keeps the last resourceVersion, and (for a watch that
// began as a watch-list) the objects passed on, so that a relist it makes
// itself can tell the reflector which are gone.
func (w *resumableWatch) pass(inner watch.Interface) (string, string) {
	in := inner.ResultChan()
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-w.stop:
			return endStopped, ""
		case ev, ok = <-in:
		}
		if !ok {
			return endClosed, "closed by the server"
		}
		if ev.Type == watch.Error {
			switch {
			case isClientStreamFailure(ev.Object) && (!w.initial || w.relisting):
				return endLost, "connection to the API server lost: " + clientStreamCause(ev.Object)
			case !w.initial && w.known != nil && isExpired(ev.Object):
				w.expired = ev.Object
				return endExpired, apierrors.FromObject(ev.Object).Error()
			}
			w.send(w.handed(ev.Object))
			return endHanded, "" // the reflector handles the server's error
		}
		m, err := meta.Accessor(ev.Object)
		if err != nil {
			if !w.send(ev) {
				return endStopped, ""
			}
			continue
		}
		if rv := m.GetResourceVersion(); rv != "" {
			w.lastRV = rv
		}
		if w.known != nil && ev.Type != watch.Bookmark {
			key, kerr := cache.MetaNamespaceKeyFunc(ev.Object)
			if kerr == nil {
				if ev.Type == watch.Deleted {
					delete(w.known, key)
				} else {
					w.known[key] = ev.Object
				}
				if w.relisting {
					w.seen[key] = true
				}
			}
		}
		if w.initial && ev.Type == watch.Bookmark && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
			if w.relisting && !w.sendGone() {
				return endStopped, ""
			}
			w.initial, w.relisting, w.seen = false, false, nil
		}
		if !w.send(ev) {
			return endStopped, ""
		}
	}
}

// handed is the Error event that hands status, a server's error, to the
// reflector. While a relist of ours is under way the reflector has been
// given objects at their own resourceVersions, in key order, older than
// the stream's, and it takes the last one's as its own: an error it answers
// by watching again from there (a 429: it sleeps its backoff and watches,
// without a list) missed for good what the relist was to tell it, such as
// a Service deleted while the watch was away. It is handed a 410 instead,
// which it answers by listing (a whole state: what is gone goes).
func (w *resumableWatch) handed(status runtime.Object) watch.Event {
	if !w.relisting || isExpired(status) {
		return watch.Event{Type: watch.Error, Object: status}
	}
	gone := apierrors.NewResourceExpired("a relist of the watch was cut short: " + apierrors.FromObject(status).Error())
	return watch.Event{Type: watch.Error, Object: &gone.ErrStatus}
}

// sendGone tells the reflector, at the end of a relist's initial events,
// of the objects it holds that the relist did not stream: deleted meanwhile.
func (w *resumableWatch) sendGone() bool {
	for key, obj := range w.known {
		if w.seen[key] {
			continue
		}
		delete(w.known, key)
		if !w.send(watch.Event{Type: watch.Deleted, Object: obj}) {
			return false
		}
	}
	return true
}

// isExpired reports a 410 Status.
func isExpired(obj runtime.Object) bool {
	err := apierrors.FromObject(obj)
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// statusOf is err as the Status object of a watch's Error event.
func statusOf(err error) runtime.Object {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		s := status.Status()
		return &s
	}
	return &apierrors.NewInternalError(err).ErrStatus
}

// clientStreamCause is what broke the stream of a client stream failure's
// Status (isClientStreamFailure), "unable to decode an event from the watch
// stream: http2: client connection lost": the Status's own message wraps it
// in "an error on the server (...)", which blamed the server for a
// connection the client gave up (its HTTP/2 health check).
func clientStreamCause(obj runtime.Object) string {
	for _, cause := range obj.(*metav1.Status).Details.Causes {
		if cause.Type == clientStreamFailure {
			return cause.Message
		}
	}
	return ""
}

// isClientStreamFailure reports an Error event's Status made by client-go of
// a stream that broke on the client's side (see clientStreamFailure).
func isClientStreamFailure(obj runtime.Object) bool {
	status, ok := obj.(*metav1.Status)
	if !ok || status.Details == nil {
		return false
	}
	for _, cause := range status.Details.Causes {
		if cause.Type == clientStreamFailure {
			return true
		}
	}
	return false
}
