package loadbalancer

import (
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// TestServicePortLifecycle checks when an entry exists, as seen through
// ServicePortNames, across the calls that add and remove its two sides.
func TestServicePortLifecycle(t *testing.T) {
	svc := svcName("life")
	type op func(lb *LoadBalancer)
	var (
		handle        op = func(lb *LoadBalancer) { lb.ServicePort(svc) }
		service       op = func(lb *LoadBalancer) { lb.SetAffinity(svc, AffinityPolicy{}) }
		endpoints     op = func(lb *LoadBalancer) { lb.SetEndpoints(svc, readyEndpoints(2)) }
		notReady      op = func(lb *LoadBalancer) { lb.SetEndpoints(svc, []Endpoint{{Addr: backend(1)}}) }
		noEndpoints   op = func(lb *LoadBalancer) { lb.SetEndpoints(svc, nil) }
		deleteService op = func(lb *LoadBalancer) { lb.DeleteServicePort(svc) }
	)
	tests := []struct {
		name string
		ops  []op
		want bool // svc is known at the end
	}{
		{name: "nothing", ops: nil, want: false},
		{name: "empty endpoints for an unknown port do not create it", ops: []op{noEndpoints}, want: false},
		{name: "delete of an unknown port is a no-op", ops: []op{deleteService}, want: false},
		{name: "service only", ops: []op{service}, want: true},
		{name: "endpoints only", ops: []op{endpoints}, want: true},
		{name: "endpoints that are not ready still keep it", ops: []op{notReady}, want: true},
		{name: "handle counts as the service side", ops: []op{handle, noEndpoints}, want: true},
		{name: "service deleted, endpoints remain", ops: []op{service, endpoints, deleteService}, want: true},
		{name: "service deleted, then endpoints", ops: []op{service, endpoints, deleteService, noEndpoints}, want: false},
		{name: "endpoints gone, then service", ops: []op{service, endpoints, noEndpoints, deleteService}, want: false},
		{name: "endpoints gone, service stays", ops: []op{service, endpoints, noEndpoints}, want: true},
		{name: "handle then delete", ops: []op{handle, deleteService}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, _ := newTestBalancer(t)
			for _, o := range tt.ops {
				o(lb)
			}
			got := slices.Contains(lb.ServicePortNames(), svc)
			if got != tt.want {
				t.Errorf("known = %v, want %v", got, tt.want)
			}
			if _, ok := lb.Snapshot(svc); ok != tt.want {
				t.Errorf("Snapshot ok = %v, want %v", ok, tt.want)
			}
		})
	}
}

func TestServicePortHandleIsStable(t *testing.T) {
	lb, _ := newTestBalancer(t)
	svc := svcName("stable")
	h := lb.ServicePort(svc)
	lb.SetAffinity(svc, clientIPPolicy(time.Minute))
	lb.SetEndpoints(svc, readyEndpoints(3))
	lb.SetEndpoints(svc, nil)
	lb.SetEndpoints(svc, readyEndpoints(2))
	if got := lb.ServicePort(svc); got != h {
		t.Fatalf("ServicePort returned a new handle %p, want the cached %p", got, h)
	}
	// The cached handle sees the updates.
	if ep := mustNext(t, h, clientA, false); ep != backend(1) {
		t.Errorf("cached handle picked %v, want %v", ep, backend(1))
	}
}

func TestDeleteServicePortKeepsEndpointsDropsAffinity(t *testing.T) {
	lb, _ := newTestBalancer(t)
	svc := svcName("del")
	lb.SetAffinity(svc, clientIPPolicy(time.Hour))
	lb.SetEndpoints(svc, readyEndpoints(3))
	sp := lb.ServicePort(svc)
	mustNext(t, sp, clientA, false)

	lb.DeleteServicePort(svc)
	snap, ok := lb.Snapshot(svc)
	if !ok {
		t.Fatal("entry gone although it still has endpoints")
	}
	if snap.Affinity != (AffinityPolicy{}) || len(snap.Clients) != 0 {
		t.Errorf("after delete: affinity %+v with %d clients, want none", snap.Affinity, len(snap.Clients))
	}
	if len(snap.Endpoints) != 3 {
		t.Errorf("after delete: %d endpoints, want 3 kept", len(snap.Endpoints))
	}
}

func TestSweep(t *testing.T) {
	lb, clk := newTestBalancer(t)
	short, long, none := svcName("short"), svcName("long"), svcName("none")
	lb.SetAffinity(short, clientIPPolicy(10*time.Second))
	lb.SetAffinity(long, clientIPPolicy(time.Hour))
	lb.SetAffinity(none, AffinityPolicy{})
	for _, svc := range []ServicePortName{short, long, none} {
		lb.SetEndpoints(svc, readyEndpoints(3))
	}
	for _, svc := range []ServicePortName{short, long, none} {
		mustNext(t, lb.ServicePort(svc), clientA, false) // at t0
	}
	clk.SetTime(clk.Now().Add(5 * time.Second))
	mustNext(t, lb.ServicePort(short), clientB, false) // at t0+5s

	tests := []struct {
		at          time.Duration // since t0
		wantSwept   int
		wantClients map[ServicePortName]int
	}{
		{at: 9 * time.Second, wantSwept: 0, wantClients: map[ServicePortName]int{short: 2, long: 1}},
		{at: 10 * time.Second, wantSwept: 1, wantClients: map[ServicePortName]int{short: 1, long: 1}},
		{at: 15 * time.Second, wantSwept: 1, wantClients: map[ServicePortName]int{short: 0, long: 1}},
		{at: time.Hour, wantSwept: 1, wantClients: map[ServicePortName]int{short: 0, long: 0}},
	}
	for _, tt := range tests {
		clk.SetTime(testStart.Add(tt.at))
		if got := lb.Sweep(); got != tt.wantSwept {
			t.Errorf("at t0+%v: Sweep = %d, want %d", tt.at, got, tt.wantSwept)
		}
		for svc, want := range tt.wantClients {
			sp := lb.ServicePort(svc)
			sp.mu.Lock()
			got := sp.clients.len()
			sp.mu.Unlock()
			if got != want {
				t.Errorf("at t0+%v: %v has %d entries, want %d", tt.at, svc, got, want)
			}
		}
	}
}

func TestServicePortNamesSorted(t *testing.T) {
	lb, _ := newTestBalancer(t)
	udp := svcName("b")
	udp.Protocol = v1.ProtocolUDP
	for _, svc := range []ServicePortName{svcName("c"), udp, svcName("a"), svcName("b")} {
		lb.SetAffinity(svc, AffinityPolicy{})
	}
	want := []ServicePortName{svcName("a"), svcName("b"), udp, svcName("c")}
	if got := lb.ServicePortNames(); !slices.Equal(got, want) {
		t.Errorf("ServicePortNames = %v, want %v", got, want)
	}
}
