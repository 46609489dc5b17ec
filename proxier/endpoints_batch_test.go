package proxier

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// sliceEvent is one EndpointSlice handler call: an add (old nil), an
// update, or a delete (es nil, old the slice deleted).
type sliceEvent struct{ old, es *discovery.EndpointSlice }

func (e sliceEvent) deliver(p *Proxier) {
	switch {
	case e.old == nil:
		p.OnEndpointSliceAdd(e.es)
	case e.es == nil:
		p.OnEndpointSliceDelete(e.old)
	default:
		p.OnEndpointSliceUpdate(e.old, e.es)
	}
}

// servedState is what the balancer serves for every service port it knows
// (eligible endpoints, sorted) and each Service's local pods.
func servedState(t *testing.T, p *Proxier, svcs ...string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, spn := range p.lb.ServicePortNames() {
		if got := endpointsOf(t, p, spn); len(got) > 0 {
			out[spn.String()+"/"+string(spn.Protocol)] = got
		}
	}
	for _, name := range svcs {
		n := p.endpoints.localEndpoints(types.NamespacedName{Namespace: "default", Name: name}, mustAddr("10.0.0.1"))
		out["local "+name] = []string{fmt.Sprint(n)}
	}
	return out
}

// batchEdgeEvents are slice events of the edge cases a batch must serve as
// the same events one by one do: an address in two slices (ready and
// terminating; a reused pod IP), ports named differently across slices,
// IPv4, IPv6 and FQDN slices of one Service, a slice moved to another
// Service, one deleted, one updated twice, one turned FQDN.
func batchEdgeEvents() []sliceEvent {
	named := func(es *discovery.EndpointSlice, name string) *discovery.EndpointSlice {
		es.Name = name
		return es
	}
	cond := func(ready, serving, terminating bool) discovery.EndpointConditions {
		return discovery.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}
	}
	a := named(makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080", "10.1.0.2:8080"), "web-a")
	a.Endpoints[1].NodeName = ptr.To("n1")
	b := named(makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080"), "web-b")
	b.Endpoints[0].Conditions = cond(false, false, true) // the ready copy in web-a wins
	// A reused pod IP: the old pod's copy terminating and serving, the new
	// pod's not terminating and not ready yet: the new pod's copy wins.
	reusedOld := named(makeSlice("web", v1.ProtocolTCP, "10.1.0.3:8080"), "web-c")
	reusedOld.Endpoints[0].Conditions = cond(false, true, true)
	reusedNew := named(makeSlice("web", v1.ProtocolTCP, "10.1.0.3:8080"), "web-0")
	reusedNew.Endpoints[0].Conditions = cond(false, false, false)
	other := named(makeSlice("web", v1.ProtocolTCP, "10.1.0.4:9090"), "web-q")
	other.Ports[0].Name = ptr.To("q") // another port of the Service
	v6 := named(makeSlice("web", v1.ProtocolTCP, "[fd00::1]:8080"), "web-v6")
	v6.AddressType = discovery.AddressTypeIPv6
	fqdn := named(makeSlice("web", v1.ProtocolTCP, "10.1.0.9:8080"), "web-fqdn")
	fqdn.AddressType, fqdn.Endpoints[0].Addresses = discovery.AddressTypeFQDN, []string{"db.example.com"}
	mover := named(makeSlice("web", v1.ProtocolTCP, "10.1.0.5:8080"), "web-m")
	moved := mover.DeepCopy()
	moved.Labels[discovery.LabelServiceName] = "db"
	gone := named(makeSlice("web", v1.ProtocolTCP, "10.1.0.6:8080"), "web-g")
	twice := named(makeSlice("db", v1.ProtocolTCP, "10.2.0.1:5432"), "db-t")
	twice2 := named(makeSlice("db", v1.ProtocolTCP, "10.2.0.2:5432"), "db-t")
	twice3 := named(makeSlice("db", v1.ProtocolTCP, "10.2.0.3:5432", "10.2.0.2:5432"), "db-t")
	twice3.Endpoints[1].NodeName = ptr.To("n1")
	turned := named(makeSlice("db", v1.ProtocolTCP, "10.2.0.9:5432"), "db-f")
	turnedFQDN := turned.DeepCopy()
	turnedFQDN.AddressType, turnedFQDN.Endpoints[0].Addresses = discovery.AddressTypeFQDN, []string{"x.example.com"}
	only := named(makeSlice("solo", v1.ProtocolUDP, "10.3.0.1:53"), "solo-1")
	return []sliceEvent{
		{es: a}, {es: b}, {es: reusedOld}, {es: reusedNew}, {es: other}, {es: v6}, {es: fqdn},
		{es: mover}, {es: gone}, {es: twice}, {es: turned}, {es: only},
		{old: mover, es: moved}, {old: gone}, {old: twice, es: twice2}, {old: twice2, es: twice3},
		{old: turned, es: turnedFQDN}, {old: only},
	}
}

// TestBatchServesAsEventsOneByOne: the slice events of a batch, served
// once at its end with each Service merged once, leave the balancer as the
// same events delivered one by one did, edge cases included; which copy
// of an address in two slices wins does not change.
func TestBatchServesAsEventsOneByOne(t *testing.T) {
	events := batchEdgeEvents()
	newProxier := func() *Proxier {
		p := newTestProxier(t, Options{NodeName: "n1"})
		p.OnServiceAdd(makeService("web"))
		p.OnServiceAdd(makeService("db", withClusterIP("10.96.0.22")))
		p.Sync()
		return p
	}
	svcs := []string{"web", "db", "solo"}
	oneByOne := newProxier()
	for _, e := range events {
		e.deliver(oneByOne)
	}
	want := servedState(t, oneByOne, svcs...)
	for k, v := range map[string][]string{
		"default/web:p/TCP": {"10.1.0.1", "10.1.0.2"}, // 10.1.0.1 ready (web-a's copy), 10.1.0.3 the new pod's: not ready
		"default/web:q/TCP": {"10.1.0.4"},
		"default/db:p/TCP":  {"10.1.0.5", "10.2.0.2", "10.2.0.3"},
		"local web":         {"1"},
		"local db":          {"1"},
	} {
		if !slices.Equal(want[k], v) {
			t.Fatalf("one by one: %s serves %v, want %v (all: %v)", k, want[k], v, want)
		}
	}
	if _, ok := want["default/solo:p/UDP"]; ok {
		t.Fatalf("one by one: solo serves %v after its only slice was deleted", want["default/solo:p/UDP"])
	}
	// The same events in one batch, in two batches nested, and in one
	// batch per half.
	for _, tc := range []struct {
		name string
		run  func(p *Proxier)
	}{
		{"one batch", func(p *Proxier) {
			p.BeginBatch()
			for _, e := range events {
				e.deliver(p)
			}
			p.EndBatch()
		}},
		{"nested", func(p *Proxier) {
			p.BeginBatch()
			for i, e := range events {
				if i == 3 {
					p.BeginBatch()
				}
				e.deliver(p)
				if i == 10 {
					p.EndBatch()
				}
			}
			p.EndBatch()
		}},
		{"two batches", func(p *Proxier) {
			for _, half := range [][]sliceEvent{events[:9], events[9:]} {
				p.BeginBatch()
				for _, e := range half {
					e.deliver(p)
				}
				p.EndBatch()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProxier()
			tc.run(p)
			got := servedState(t, p, svcs...)
			keys := maps.Clone(want)
			maps.Copy(keys, got)
			for _, k := range slices.Sorted(maps.Keys(keys)) {
				if !slices.Equal(got[k], want[k]) {
					t.Errorf("%s: %v, want %v as one by one", k, got[k], want[k])
				}
			}
		})
	}
}

// TestBatchObservesTriggersWhenServed: a slice's trigger time in a batch
// is observed when the batch ends (its endpoints are served then), once
// per slice added or updated; an EndBatch without a batch changes nothing.
func TestBatchObservesTriggersWhenServed(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(start)
	p := newTestProxier(t, Options{Clock: clk})
	p.OnServiceAdd(makeService("web"))
	p.Sync()
	clk.Step(time.Second)
	trigger := clk.Now().Format(time.RFC3339Nano)
	p.EndBatch() // none open: no effect
	p.BeginBatch()
	for i := range 3 {
		es := makeSlice("web", v1.ProtocolTCP, fmt.Sprintf("10.1.0.%d:8080", i+1))
		es.Name = fmt.Sprintf("web-%d", i)
		es.Annotations = map[string]string{endpointsTriggerTimeAnnotation: trigger}
		p.OnEndpointSliceAdd(es)
	}
	clk.Step(250 * time.Millisecond)
	var m dtoHistogram
	m.read(t, p)
	if m.count != 0 {
		t.Fatalf("%d programming latencies observed before the batch ended, want 0", m.count)
	}
	p.EndBatch()
	if got := endpointsOf(t, p, p.lbName("default/web:p")); len(got) != 3 {
		t.Fatalf("after the batch: %v served, want the 3 endpoints", got)
	}
	m = dtoHistogram{}
	m.read(t, p)
	if m.count != 3 || m.sum < 0.749 || m.sum > 0.751 {
		t.Fatalf("programming latency count %d sum %.3fs, want 3 samples of 0.25s", m.count, m.sum)
	}
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "10.1.0.9:8080"))
	if got := endpointsOf(t, p, p.lbName("default/web:p")); len(got) != 4 {
		t.Fatalf("a slice out of any batch: %v served, want 4 endpoints at once", got)
	}
}

// TestBatchDropsTriggersOfAServiceLeftWithoutSlices: a slice added and
// deleted in one batch, the Service's only one, leaves no trigger time to
// observe, as deleting a Service's last slice drops its pending ones one by
// one; and a batch's dirty Services are not applied again by later batches.
func TestBatchDropsTriggersOfAServiceLeftWithoutSlices(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(start)
	p := newTestProxier(t, Options{Clock: clk})
	p.OnServiceAdd(makeService("web"))
	p.OnServiceAdd(makeService("db"))
	p.Sync()
	clk.Step(time.Second)
	es := makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080")
	es.Annotations = map[string]string{endpointsTriggerTimeAnnotation: clk.Now().Format(time.RFC3339Nano)}
	p.BeginBatch()
	p.OnEndpointSliceAdd(es)
	p.OnEndpointSliceDelete(es)
	p.EndBatch()
	var m dtoHistogram
	m.read(t, p)
	if m.count != 0 {
		t.Errorf("%d programming latencies observed for a Service left without slices, want 0", m.count)
	}
	p.endpoints.mu.Lock()
	pending, dirty := len(p.endpoints.pending), len(p.endpoints.dirty)
	p.endpoints.mu.Unlock()
	if pending != 0 || dirty != 0 {
		t.Errorf("after the batch: %d Services with pending trigger times, %d dirty; want none", pending, dirty)
	}
	p.BeginBatch()
	p.OnEndpointSliceAdd(makeSlice("db", v1.ProtocolTCP, "10.2.0.1:5432"))
	p.endpoints.mu.Lock()
	dirty = len(p.endpoints.dirty)
	p.endpoints.mu.Unlock()
	p.EndBatch()
	if dirty != 1 {
		t.Errorf("the next batch holds %d dirty Services, want only its own", dirty)
	}
}

// TestBatchEndServesWhileAnotherIsOpen: a batch that ends serves its
// slices though another source's batch is still open. The last known
// state is served (its own batch) when the API server has not synced
// within the grace, which can be while the informer delivers its initial
// list (that batch open until the list is all delivered): the file's
// Services were then synced and served with no endpoint, their clients
// refused, until the informer's list ended.
func TestBatchEndServesWhileAnotherIsOpen(t *testing.T) {
	p := newTestProxier(t, Options{})
	path := filepath.Join(t.TempDir(), "state.json")
	file := config.State{Written: time.Now(), Services: []*v1.Service{makeService("web")},
		EndpointSlices: []*discovery.EndpointSlice{makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080")}}
	if err := config.WriteStateFile(path, file); err != nil {
		t.Fatal(err)
	}
	s := config.NewLastKnownState(path, p, time.Millisecond)
	s.OnServiceAdd(makeService("db", withClusterIP("10.96.0.22")))
	s.BeginBatch() // the informer's initial list, being delivered
	s.OnEndpointSliceAdd(makeSlice("db", v1.ProtocolTCP, "10.2.0.1:5432"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	spn := func(svc string) loadbalancer.ServicePortName {
		return loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: svc}, Port: "p", Protocol: v1.ProtocolTCP}
	}
	for deadline := time.Now().Add(3 * time.Second); len(endpointsOf(t, p, spn("web"))) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the last known state served (%v) with no endpoint for its Service while the source's batch is open",
				s.Status().Serving)
		}
	}
	s.EndBatch()
	if got := endpointsOf(t, p, spn("db")); len(got) != 1 {
		t.Fatalf("after the source's batch: db serves %v, want its endpoint", got)
	}
}
