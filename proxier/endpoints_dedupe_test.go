package proxier

import (
	"net/netip"
	"testing"

	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// TestEndpointInTwoSlicesServesByItsBestCopy: the same address in two slices
// of a Service (ready in one, not ready in the other, as while it moves
// between slices) is one endpoint, ready, every time the slices are read:
// map order used to decide which copy was kept, so identical input flipped
// it in and out of the balancer.
func TestEndpointInTwoSlicesServesByItsBestCopy(t *testing.T) {
	svc := types.NamespacedName{Namespace: "default", Name: "web"}
	a := makeSlice("web", "TCP", "10.0.0.1:80", "10.0.0.2:80")
	a.Name = "web-a"
	b := makeSlice("web", "TCP", "10.0.0.1:80")
	b.Name = "web-b"
	b.Endpoints[0].Conditions = discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
	in := map[string]*discovery.EndpointSlice{a.Name: a, b.Name: b}
	for range 100 {
		for spn, eps := range endpointsByPort(svc, in) {
			eps = dedupe(eps)
			if len(eps) != 2 || eps[0].Addr != netip.MustParseAddrPort("10.0.0.1:80") || !eps[0].Ready {
				t.Fatalf("%s: %+v, want 10.0.0.1:80 ready, then 10.0.0.2:80", spn, eps)
			}
		}
	}
}

// TestReusedPodIPServesByTheRunningPod: a pod network that reuses a
// terminating pod's IP for a new pod lists the address twice, the old copy
// terminating (and perhaps still serving), the new one not terminating.
// kube-proxy keeps the new pod's copy whatever the order (its
// endpointslicecache addEndpoints, kubernetes#135266), so until the new pod
// is ready the address serves nothing; the best-serving copy kept the old
// pod's, and traffic went to the new pod before it was ready (an
// externalTrafficPolicy Local node kept taking external clients).
func TestReusedPodIPServesByTheRunningPod(t *testing.T) {
	svc := types.NamespacedName{Namespace: "default", Name: "web"}
	old := makeSlice("web", "TCP", "10.0.0.1:80", "10.0.0.2:80")
	old.Name = "web-a"
	old.Endpoints[0].Conditions = discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	old.Endpoints[1].Conditions = discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	fresh := makeSlice("web", "TCP", "10.0.0.1:80")
	fresh.Name = "web-b"
	fresh.Endpoints[0].Conditions = discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
	for _, names := range [][2]string{{"web-a", "web-b"}, {"web-b", "web-a"}} {
		// Either name order, so either copy is read first.
		old.Name, fresh.Name = names[0], names[1]
		in := map[string]*discovery.EndpointSlice{old.Name: old, fresh.Name: fresh}
		for spn, eps := range endpointsByPort(svc, in) {
			eps = dedupe(eps)
			if len(eps) != 2 || eps[0].Addr != netip.MustParseAddrPort("10.0.0.1:80") || eps[0].Terminating || eps[0].Serving {
				t.Fatalf("%s (slices %v): %+v, want 10.0.0.1:80 as the new pod's copy (not terminating, not serving)", spn, names, eps)
			}
		}
	}
}

// TestEndpointWithSeveralAddressesIsOneSlot: an endpoint's addresses are
// fungible (the API lets consumers use the first only, as kube-proxy does):
// a pod with two addresses is one round-robin slot, not two.
func TestEndpointWithSeveralAddressesIsOneSlot(t *testing.T) {
	es := makeSlice("web", "TCP", "10.0.0.1:80", "10.0.0.2:80")
	es.Endpoints[0].Addresses = append(es.Endpoints[0].Addresses, "10.0.0.9")
	for spn, eps := range endpointsByPort(types.NamespacedName{Namespace: "default", Name: "web"}, map[string]*discovery.EndpointSlice{es.Name: es}) {
		if len(eps) != 2 {
			t.Errorf("%s: %d endpoints %+v, want 2", spn, len(eps), eps)
		}
	}
}

// TestSliceRelabelledLeavesItsOldService: a slice whose service-name label
// moves to another Service takes its endpoints with it; the old Service
// kept them until the slice was deleted (an update names only the new one).
func TestSliceRelabelledLeavesItsOldService(t *testing.T) {
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("y1", withClusterIP("10.96.0.21")))
	p.OnServiceAdd(makeService("y2", withClusterIP("10.96.0.22")))
	es := makeSlice("y1", "TCP", "10.0.0.8:8080")
	p.OnEndpointSliceAdd(es)
	p.Sync()
	moved := es.DeepCopy()
	moved.Labels[discovery.LabelServiceName] = "y2"
	p.OnEndpointSliceUpdate(es, moved)
	p.Sync()
	endpoints := map[string][]string{}
	for _, r := range p.DebugServices() {
		endpoints[r.ServicePort] = r.Endpoints
	}
	if got := endpoints["default/y1:p"]; len(got) != 0 {
		t.Errorf("y1 keeps %v after its slice moved to y2", got)
	}
	if got := endpoints["default/y2:p"]; len(got) != 1 || got[0] != "10.0.0.8:8080" {
		t.Errorf("y2 has %v, want [10.0.0.8:8080]", got)
	}
}

// TestEndpointConditionsUnsetMeanTrue: a nil ready or serving condition is
// true, as the discovery API says and kube-proxy reads it; a terminating
// endpoint whose serving is unset is a fallback like one serving: true.
// With serving read as "ready" it was no candidate, and a Service whose
// hand-written slice listed only such endpoints reset every connection.
func TestEndpointConditionsUnsetMeanTrue(t *testing.T) {
	tests := []struct {
		name string
		c    discovery.EndpointConditions
		want [3]bool // ready, serving, terminating
	}{
		{"none set", discovery.EndpointConditions{}, [3]bool{true, true, false}},
		{"terminating, serving unset", discovery.EndpointConditions{Ready: ptr.To(false), Terminating: ptr.To(true)}, [3]bool{false, true, true}},
		{"not ready, serving unset", discovery.EndpointConditions{Ready: ptr.To(false)}, [3]bool{false, true, false}},
		{"terminating, not serving", discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}, [3]bool{false, false, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := endpointFromSlice(discovery.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: tt.c})
			if got := [3]bool{e.Ready, e.Serving, e.Terminating}; got != tt.want {
				t.Fatalf("ready, serving, terminating = %v, want %v", got, tt.want)
			}
		})
	}
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("web"))
	es := makeSlice("web", "TCP", "10.1.0.1:8080")
	es.Endpoints[0].Conditions = discovery.EndpointConditions{Ready: ptr.To(false), Terminating: ptr.To(true)}
	p.OnEndpointSliceAdd(es)
	p.Sync()
	if got := endpointsOf(t, p, p.lbName("default/web:p")); len(got) != 1 || got[0] != "10.1.0.1" {
		t.Fatalf("balancer endpoints %v, want the terminating endpoint as the fallback", got)
	}
}
