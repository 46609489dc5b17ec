package main

import (
	"context"
	"errors"
	"time"

	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
)

// reportingController names this proxy in the events it records, where
// kube-proxy writes "kube-proxy".
const reportingController = "kube-userspace-proxy"

// nodeEvents records the events kube-proxy records, through the
// events.k8s.io API the deploy ClusterRole grants (create, patch): Starting
// on this node's Node once the proxy runs, and
// FailedToStartServiceHealthcheck on a Service whose healthCheckNodePort
// cannot be listened on. Recording is asynchronous; the broadcaster stops
// with ctx.
type nodeEvents struct {
	recorder events.EventRecorder
	node     *v1.ObjectReference
}

func startNodeEvents(ctx context.Context, client kubernetes.Interface, node string) *nodeEvents {
	b := events.NewBroadcaster(patientSink{&events.EventSinkImpl{Interface: client.EventsV1()}})
	_ = b.StartRecordingToSinkWithContext(ctx) // errors only when started twice
	go func() {
		<-ctx.Done()
		b.Shutdown()
	}()
	return &nodeEvents{
		recorder: b.NewRecorder(scheme.Scheme, reportingController),
		node:     &v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node},
	}
}

// started is kube-proxy's event at start, on the Node.
func (e *nodeEvents) started() {
	e.recorder.Eventf(e.node, nil, v1.EventTypeNormal, "Starting", "StartKubeProxy", "")
}

// healthCheckFailed is kube-proxy's event for a healthCheckNodePort that
// could not be opened, on its Service.
func (e *nodeEvents) healthCheckFailed(nn types.NamespacedName, port int, err error) {
	svc := &v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: nn.Namespace, Name: nn.Name}
	e.recorder.Eventf(svc, nil, v1.EventTypeWarning, "FailedToStartServiceHealthcheck", "Listen",
		"node %s failed to start healthcheck %q on port %d: %v", e.node.Name, nn.String(), port, err)
}

// eventRetryInterval is how often patientSink tries again a write the API
// server did not answer (client-go's broadcaster waits 10 s too).
var eventRetryInterval = 10 * time.Second

// patientSink writes events as the sink it wraps, but a create that did
// not reach the API server (refused, timed out: no answer of its own) is
// tried again every eventRetryInterval until it does, or the proxy stops.
// client-go's broadcaster drops an event after 12 tries 10 s apart
// ("retry limit exceeded"): the Starting event of a proxy started during
// an API server outage longer than about two minutes was lost (kube-proxy
// loses it likewise). An answer, even a refusal, ends the write as
// before. Each event's write runs in a goroutine of its own
// (recordToSink), so nothing waits for it: start-up and serving go on.
type patientSink struct{ events.EventSink }

func (s patientSink) Create(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	return untilAnswered(ctx, func() (*eventsv1.Event, error) { return s.EventSink.Create(ctx, ev) })
}

// Patch is the wrapped sink's, not patient: client-go patches an event
// series from its periodic refresh with its broadcaster's lock held, so a
// patch waiting out an outage would hold every later event's goroutine
// behind it. A series patch is only a count; the event it counts was
// created already.
func (s patientSink) Patch(ctx context.Context, old *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	return s.EventSink.Patch(ctx, old, data)
}

// untilAnswered calls write until the API server answers it, or ctx ends:
// the errors client-go's broadcaster retries but the object mismatch,
// those of the transport.
func untilAnswered(ctx context.Context, write func() (*eventsv1.Event, error)) (*eventsv1.Event, error) {
	for {
		ev, err := write()
		var status apierrors.APIStatus
		var construction *rest.RequestConstructionError
		var mismatch *apierrors.UnexpectedObjectError
		if err == nil || errors.As(err, &status) || errors.As(err, &construction) || errors.As(err, &mismatch) {
			return ev, err
		}
		select {
		case <-ctx.Done():
			return ev, err
		case <-time.After(wait.Jitter(eventRetryInterval, 0.25)):
		}
	}
}
