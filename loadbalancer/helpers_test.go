package loadbalancer

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// testStart is an arbitrary fixed instant for fake clocks.
var testStart = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// newTestBalancer returns a balancer on a fake clock whose shuffle keeps the
// given order, so round robin is predictable in tests.
func newTestBalancer(t *testing.T) (*LoadBalancer, *clocktesting.FakePassiveClock) {
	t.Helper()
	clk := clocktesting.NewFakePassiveClock(testStart)
	lb := New(clk, Limits{})
	lb.shuffle = func([]netip.AddrPort) {}
	return lb, clk
}

func svcName(name string) ServicePortName {
	return ServicePortName{
		NamespacedName: types.NamespacedName{Namespace: "default", Name: name},
		Port:           "http",
		Protocol:       v1.ProtocolTCP,
	}
}

func addr(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func ip(s string) netip.Addr       { return netip.MustParseAddr(s) }

// backend returns the address of the i-th test backend, 10.0.0.i:80.
func backend(i int) netip.AddrPort { return addr(fmt.Sprintf("10.0.0.%d:80", i)) }

// readyEndpoints returns n ready endpoints, backend(1) .. backend(n).
func readyEndpoints(n int) []Endpoint {
	eps := make([]Endpoint, n)
	for i := range eps {
		eps[i] = Endpoint{Addr: backend(i + 1), Ready: true, Serving: true}
	}
	return eps
}

func clientIPPolicy(timeout time.Duration) AffinityPolicy {
	return AffinityPolicy{ClientIP: true, Timeout: timeout}
}

// mustNext calls Next and fails the test on error.
func mustNext(t *testing.T, sp *ServicePort, client netip.Addr, reset bool) netip.AddrPort {
	t.Helper()
	ep, err := sp.Next(client, reset)
	if err != nil {
		t.Fatalf("Next(%v, %v): %v", client, reset, err)
	}
	return ep
}

// picks calls Next n times for client and returns the endpoints in order.
func picks(t *testing.T, sp *ServicePort, client netip.Addr, n int) []netip.AddrPort {
	t.Helper()
	out := make([]netip.AddrPort, n)
	for i := range out {
		out[i] = mustNext(t, sp, client, false)
	}
	return out
}
