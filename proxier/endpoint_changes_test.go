package proxier

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// kubeproxy_sync_proxy_rules_endpoint_changes_total counts, as kube-proxy
// 1.37's EndpointsChangeTracker.EndpointSliceUpdate (pkg/proxy/
// endpointschangetracker.go), every EndpointSlice add, update and delete
// of an address type the node serves that names its Service, whatever it
// does to the endpoints served; and kubeproxy_network_programming_
// duration_seconds observes the trigger time of every slice added or
// updated whose content changed (endpointslicecache.go esDataChanged), not
// only of those that change the endpoints served. Counted only where the
// balancer changed, a slice update that added a not-ready endpoint, or
// made a serving-terminating fallback endpoint ready (the same one
// served), counted nothing and observed nothing.
func TestEndpointChangesCountedAsKubeProxy(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(start)
	fake := iptables.NewFakeRunner(iptables.IPv4)
	rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), NodeIP: mustAddr("127.0.0.1")})
	// An IPv4 node: IPv6 slices are no change of its (kube-proxy runs no
	// IPv6 proxier there).
	p := newTestProxier(t, Options{Clock: clk, IPv4Portals: rules})
	p.OnServiceAdd(makeService("web"))
	p.Sync()
	var samples, sum float64
	check := func(step string, changes float64, newSamples int, latency time.Duration) {
		t.Helper()
		if got := testutil.ToFloat64(p.metrics.EndpointChangesTotal); got != changes {
			t.Errorf("%s: endpoint_changes_total %v, want %v", step, got, changes)
		}
		samples += float64(newSamples)
		sum += float64(newSamples) * latency.Seconds()
		m := &dtoHistogram{}
		m.read(t, p)
		if float64(m.count) != samples || m.sum < sum-0.001 || m.sum > sum+0.001 {
			t.Errorf("%s: programming latency count %d sum %.3fs, want %v samples, sum %.3fs", step, m.count, m.sum, samples, sum)
		}
	}
	stamp := func(es *discovery.EndpointSlice, at time.Time) *discovery.EndpointSlice {
		es.Annotations = map[string]string{endpointsTriggerTimeAnnotation: at.Format(time.RFC3339Nano)}
		return es
	}

	clk.Step(time.Second)
	ready := stamp(makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080"), clk.Now())
	clk.Step(100 * time.Millisecond)
	p.OnEndpointSliceAdd(ready)
	check("slice added", 1, 1, 100*time.Millisecond)

	notReady := stamp(ready.DeepCopy(), clk.Now())
	notReady.Endpoints = append(notReady.Endpoints, discovery.Endpoint{Addresses: []string{"10.1.0.2"}, Conditions: discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false)}})
	clk.Step(200 * time.Millisecond)
	p.OnEndpointSliceUpdate(ready, notReady)
	check("a not-ready endpoint added (the endpoints served are the same)", 2, 1, 200*time.Millisecond)

	again := notReady.DeepCopy()
	p.OnEndpointSliceUpdate(notReady, again)
	check("the same slice again (no content change: no trigger observed)", 3, 0, 0)

	// All terminating: the serving one is the fallback; it turns ready
	// (serving, not terminating) and is still the only one served.
	fallback := stamp(makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080"), clk.Now())
	fallback.Endpoints[0].Conditions = discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	p.OnEndpointSliceUpdate(again, fallback)
	check("every endpoint terminating, one serving", 4, 1, 0)
	revived := stamp(makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080"), clk.Now())
	clk.Step(300 * time.Millisecond)
	p.OnEndpointSliceUpdate(fallback, revived)
	check("the serving fallback turned ready (the same endpoint served)", 5, 1, 300*time.Millisecond)

	relabelled := revived.DeepCopy()
	relabelled.Labels[discovery.LabelServiceName] = "db"
	relabelled.Annotations = nil
	p.OnEndpointSliceUpdate(revived, relabelled)
	check("a slice relabelled to another Service (one event)", 6, 0, 0)

	v6 := makeSlice("web", v1.ProtocolTCP, "[fd00::1]:8080")
	v6.Name, v6.AddressType = "web-v6", discovery.AddressTypeIPv6
	p.OnEndpointSliceAdd(stamp(v6, clk.Now()))
	fqdn := makeSlice("web", v1.ProtocolTCP, "10.1.0.9:8080")
	fqdn.Name, fqdn.AddressType, fqdn.Endpoints[0].Addresses = "web-fqdn", discovery.AddressTypeFQDN, []string{"db.example.com"}
	p.OnEndpointSliceAdd(fqdn)
	unlabelled := makeSlice("web", v1.ProtocolTCP, "10.1.0.3:8080")
	unlabelled.Name, unlabelled.Labels = "stray", nil
	p.OnEndpointSliceAdd(unlabelled)
	check("an IPv6 slice on an IPv4 node, an FQDN slice, a slice naming no Service", 6, 0, 0)

	p.OnEndpointSliceDelete(relabelled)
	check("a slice deleted", 7, 0, 0)
}

// An EndpointSlice whose addressType turns FQDN (a manifest edited; the API
// server keeps the field immutable) gives its Service no endpoint any
// more, as a new FQDN slice gives none: the update was ignored whole, so
// the slice's IPv4 endpoints of before were served until it was deleted.
func TestSliceTurnedFQDNGivesNoEndpoint(t *testing.T) {
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("web"))
	p.Sync()
	v4 := makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080")
	p.OnEndpointSliceAdd(v4)
	name := servicePortName("web")
	if snap, _ := p.lb.Snapshot(name); len(snap.Endpoints) != 1 {
		t.Fatalf("endpoints %v, want the IPv4 slice's (test set-up)", snap.Endpoints)
	}
	fqdn := v4.DeepCopy()
	fqdn.AddressType, fqdn.Endpoints[0].Addresses = discovery.AddressTypeFQDN, []string{"db.example.com"}
	p.OnEndpointSliceUpdate(v4, fqdn)
	if snap, _ := p.lb.Snapshot(name); len(snap.Endpoints) != 0 {
		t.Errorf("endpoints %v after the slice turned FQDN, want none", snap.Endpoints)
	}
	p.OnEndpointSliceUpdate(fqdn, v4)
	if snap, _ := p.lb.Snapshot(name); len(snap.Endpoints) != 1 {
		t.Errorf("endpoints %v after the slice turned IPv4 again, want its one", snap.Endpoints)
	}
}

// The FQDN slices naming a Service are remembered for explain's words
// while they name it: until deleted, relabelled, or turned IPv4.
func TestFQDNSlicesNamingAServiceAreKnown(t *testing.T) {
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("web"))
	web := servicePortName("web").NamespacedName
	check := func(step string, want []string, wantSliceless bool) {
		t.Helper()
		_, _, fqdn, ok := p.endpoints.sliceless(web, p.hasService)
		if ok != wantSliceless || !slices.Equal(fqdn, want) {
			t.Errorf("%s: sliceless %v, FQDN slices %v; want %v, %v", step, ok, fqdn, wantSliceless, want)
		}
	}
	fqdn := makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080")
	fqdn.AddressType, fqdn.Endpoints[0].Addresses = discovery.AddressTypeFQDN, []string{"db.example.com"}
	p.OnEndpointSliceAdd(fqdn)
	check("an FQDN slice", []string{"web-abc"}, true)
	v4 := makeSlice("web", v1.ProtocolTCP, "10.1.0.1:8080")
	p.OnEndpointSliceUpdate(fqdn, v4)
	check("turned IPv4", nil, false)
	p.OnEndpointSliceUpdate(v4, fqdn)
	check("FQDN again", []string{"web-abc"}, true)
	relabelled := fqdn.DeepCopy()
	relabelled.Labels[discovery.LabelServiceName] = "db"
	p.OnEndpointSliceUpdate(fqdn, relabelled)
	check("relabelled", nil, true)
	p.OnEndpointSliceUpdate(relabelled, fqdn)
	p.OnEndpointSliceDelete(fqdn)
	check("deleted", nil, true)
}
