package main

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The Starting event recorded while the API server is unreachable (a
// start during an outage, a node that reaches it late) is posted once it
// answers. client-go's broadcaster tries an event 12 times, 10 s apart,
// then drops it ("retry limit exceeded"): an outage longer than about two
// minutes at start lost it, and each try meanwhile waited its 10 s. The
// unreachable server is a create refused at the transport the first
// several times.
func TestStartingEventPostedOnceTheAPIServerAnswers(t *testing.T) {
	fastEventRetries(t)

	client := fake.NewClientset()
	var mu sync.Mutex
	refused, created := 0, []*eventsv1.Event(nil)
	const unreachable = 13 // past client-go's 12 tries
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if refused < unreachable {
			refused++
			return true, nil, &url.Error{Op: "Post", URL: "https://10.0.0.1:6443/apis/events.k8s.io/v1/namespaces/default/events",
				Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
		}
		ev := a.(k8stesting.CreateAction).GetObject().(*eventsv1.Event)
		created = append(created, ev)
		return true, ev, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	startNodeEvents(ctx, client, "node-1").started()

	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n, tries := len(created), refused
		var ev *eventsv1.Event
		if n > 0 {
			ev = created[0]
		}
		mu.Unlock()
		if n > 0 {
			if ev.Reason != "Starting" || ev.Regarding.Kind != "Node" || ev.Regarding.Name != "node-1" {
				t.Errorf("posted %s on %s %s, want Starting on Node node-1", ev.Reason, ev.Regarding.Kind, ev.Regarding.Name)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Starting event posted within 10 s: %d creates refused at the transport (the API server answers from the %dth)", tries, unreachable+1)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An answer ends the write, a refusal included: an API server that forbids
// the proxy to create events (a ClusterRole without events create) is not
// asked again and again. patientSink waits only for an API server that
// does not answer; client-go's broadcaster drops a refused event, as
// kube-proxy's does.
func TestRefusedEventIsNotTriedAgain(t *testing.T) {
	fastEventRetries(t)

	client := fake.NewClientset()
	var mu sync.Mutex
	creates := 0
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		creates++
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "", errors.New("RBAC: no create"))
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	startNodeEvents(ctx, client, "node-1").started()
	tried := func() int {
		mu.Lock()
		defer mu.Unlock()
		return creates
	}
	for deadline := time.Now().Add(10 * time.Second); tried() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Starting event was not posted within 10 s")
		}
	}
	// 30 retry intervals: a write tried again on a refusal asks again
	// within them (the right code never asks twice, whatever the load).
	time.Sleep(30 * eventRetryInterval)
	if n := tried(); n != 1 {
		t.Errorf("a forbidden event was created %d times, want 1: a refusal is an answer", n)
	}
}

// countingSink is an events.EventSink whose every write fails as an
// unreachable API server's do, counting them.
type countingSink struct{ creates, patches atomic.Int32 }

func (s *countingSink) Create(context.Context, *eventsv1.Event) (*eventsv1.Event, error) {
	s.creates.Add(1)
	return nil, errors.New("dial tcp 10.96.0.1:443: connect: connection refused")
}

func (s *countingSink) Update(context.Context, *eventsv1.Event) (*eventsv1.Event, error) {
	return nil, errors.New("not used")
}

func (s *countingSink) Patch(context.Context, *eventsv1.Event, []byte) (*eventsv1.Event, error) {
	s.patches.Add(1)
	return nil, errors.New("dial tcp 10.96.0.1:443: connect: connection refused")
}

// A series patch is not waited out: client-go patches series from its
// periodic refresh holding its broadcaster's lock, and a patch patient
// through an outage held every later event's goroutine behind it.
func TestSeriesPatchIsNotPatient(t *testing.T) {
	fastEventRetries(t)
	sink := &countingSink{}
	done := make(chan error, 1)
	go func() {
		_, err := patientSink{sink}.Patch(context.Background(), &eventsv1.Event{}, []byte("{}"))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || sink.patches.Load() != 1 {
			t.Errorf("Patch: %v after %d tries, want the transport's error after 1", err, sink.patches.Load())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Patch still waiting after 10 s (%d tries): it holds client-go's broadcaster lock", sink.patches.Load())
	}
}

// fastEventRetries makes patientSink try again every 10 ms until the test
// ends.
func fastEventRetries(t *testing.T) {
	saved := eventRetryInterval
	eventRetryInterval = 10 * time.Millisecond
	t.Cleanup(func() { eventRetryInterval = saved })
}
