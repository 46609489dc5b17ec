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
	"k8s.io/klog/v2"
)

// clientStreamFailure is the cause client-go's StreamWatcher gives the Error
// event it makes of a watch stream that broke on the client's side (the
// connection aborted, an HTTP/2 ping unanswered): "unable to decode an event
// from the watch stream: ...".
const clientStreamFailure = "ClientWatchDecoding"

// resumeEvery spaces the resumes of one watch: a server that ends every
// stream at once is not asked again in a loop (tests shorten it).
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
// to a minute after the API server answered again. A resume the server
// cannot serve (410: its history no longer reaches that resourceVersion),
// or any other error, is handed to the reflector, which lists again.
//
// A stream opened with sendInitialEvents (client-go's watch-list) is passed
// on as is until its initial-events-end bookmark: an initial list cut short
// cannot be resumed, the reflector must start it over.
type resumableWatch struct {
	what   string
	resume func(ctx context.Context, rv string) (watch.Interface, error)
	ctx    context.Context
	cancel context.CancelFunc

	result   chan watch.Event
	stop     chan struct{}
	stopOnce sync.Once
	mu       sync.Mutex // guards inner, which run replaces at a resume
	inner    watch.Interface
}

func newResumableWatch(ctx context.Context, inner watch.Interface, opts metav1.ListOptions, what string,
	resume func(ctx context.Context, rv string) (watch.Interface, error)) *resumableWatch {
	w := &resumableWatch{what: what, resume: resume, inner: inner, result: make(chan watch.Event), stop: make(chan struct{})}
	w.ctx, w.cancel = context.WithCancel(ctx)
	initialEvents := opts.SendInitialEvents != nil && *opts.SendInitialEvents
	go w.run(inner, !initialEvents)
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

func (w *resumableWatch) run(inner watch.Interface, resumable bool) {
	defer close(w.result)
	defer w.cancel()
	lastRV, began := "", time.Now()
	for {
		end := w.pass(inner, &resumable, &lastRV)
		inner.Stop()
		if end == "stopped" || !resumable || lastRV == "" {
			return
		}
		klog.V(2).InfoS("Watch stream ended; watching again from the last resourceVersion", "informer", w.what, "resourceVersion", lastRV, "why", end)
		if wait := resumeEvery - time.Since(began); wait > 0 {
			select {
			case <-w.stop:
				return
			case <-time.After(wait):
			}
		}
		next, err := w.resume(w.ctx, lastRV)
		if err != nil {
			if w.ctx.Err() == nil {
				w.send(watch.Event{Type: watch.Error, Object: statusOf(err)})
			}
			return
		}
		w.mu.Lock()
		select {
		case <-w.stop:
			w.mu.Unlock()
			next.Stop()
			return
		default:
		}
		w.inner, inner = next, next
		w.mu.Unlock()
		began = time.Now()
	}
}

// pass passes inner's events on until its stream ends, and says why it
// ended: "stopped" (by Stop), "closed" (by the server) or "lost" (broken).
// A server's error is passed on like any event (its close follows).
func (w *resumableWatch) pass(inner watch.Interface, resumable *bool, lastRV *string) string {
	in := inner.ResultChan()
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-w.stop:
			return "stopped"
		case ev, ok = <-in:
		}
		if !ok {
			return "closed"
		}
		if ev.Type == watch.Error {
			if *resumable && isClientStreamFailure(ev.Object) {
				return "lost: " + apierrors.FromObject(ev.Object).Error()
			}
			*resumable = false // the reflector handles the server's error
		} else if m, err := meta.Accessor(ev.Object); err == nil {
			if rv := m.GetResourceVersion(); rv != "" {
				*lastRV = rv
			}
			if !*resumable && ev.Type == watch.Bookmark && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				*resumable = true
			}
		}
		if !w.send(ev) {
			return "stopped"
		}
	}
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
