package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
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
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
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
