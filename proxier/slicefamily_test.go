package proxier

import (
	"net"
	"net/netip"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A single-stack Service takes only the EndpointSlices of its own family,
// as kube-proxy, whose proxier of a family holds that family's slices and
// Services with a ClusterIP of that family only: an IPv4 Service whose
// only slice is IPv6 (a selectorless Service's hand-made slice, or the
// moment after a dual-stack Service went IPv4-only) has no endpoints and
// refuses its clients, and its healthCheckNodePort counts no local pod.
// Here the IPv6 endpoint served the IPv4 Service's clients.
func TestSingleStackServiceIgnoresOtherFamilySlices(t *testing.T) {
	bs := startBackends(t, "::1")
	svc := makeService("web", withNodePort(30080), func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 30999
	})
	p := newTestProxier(t, Options{BindAddress: netip.MustParseAddr("::"), NodeName: "node1"})
	p.OnServiceAdd(svc)
	v6 := makeSlice("web", v1.ProtocolTCP, net.JoinHostPort("::1", portOf(bs[0].ln.Addr())))
	v6.Name, v6.AddressType = "web-v6", discovery.AddressTypeIPv6
	node := "node1"
	v6.Endpoints[0].NodeName = &node
	p.OnEndpointSliceAdd(v6)
	p.Sync()
	port, ok := p.ProxyPort("default/web:p")
	if !ok {
		t.Fatal("no proxy socket")
	}
	if got, err := askName(t, "127.0.0.1", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
		t.Errorf("IPv4-only Service was served by %q, an endpoint of its IPv6 slice", got)
	}
	if n := p.LocalEndpoints(types.NamespacedName{Namespace: "default", Name: "web"}); n != 0 {
		t.Errorf("local endpoints %d, want 0: the IPv6 slice is not the IPv4 Service's", n)
	}

	// The Service turns dual-stack: the slice is its now.
	dual := svc.DeepCopy()
	dual.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
	p.OnServiceUpdate(svc, dual)
	p.Sync()
	port, _ = p.ProxyPort("default/web:p")
	if got, err := askName(t, "::1", net.JoinHostPort("::1", strconv.Itoa(port))); err != nil || got != "backend-a" {
		t.Errorf("IPv6 client of the dual-stack Service: %q, %v", got, err)
	}
	if n := p.LocalEndpoints(types.NamespacedName{Namespace: "default", Name: "web"}); n != 1 {
		t.Errorf("local endpoints of the dual-stack Service %d, want 1", n)
	}

	// And back to IPv4 only: the IPv6 endpoint is left out again.
	p.OnServiceUpdate(dual, svc)
	p.Sync()
	port, _ = p.ProxyPort("default/web:p")
	if got, err := askName(t, "127.0.0.1", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
		t.Errorf("IPv4-only Service (again) was served by %q, an endpoint of its IPv6 slice", got)
	}
}

// On a node that serves one family only (no IPv6 netfilter, or an IPv4
// --bind-address), a dual-stack Service is served in that family, as by
// kube-proxy's one proxier there: its other family's slices give it
// nothing, so its healthCheckNodePort counts only the served family's
// local pods, on whichever node address the check arrives (kube-proxy's
// IPv4 proxier's server listens on the wildcard), and an IPv6 check said
// 200 for a local IPv6 pod that no IPv6 NodePort or portal reaches.
func TestOneFamilyNodeCountsOnlyItsFamily(t *testing.T) {
	svc := makeService("web", withNodePort(30080), func(s *v1.Service) {
		s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 30999
	})
	p := newTestProxier(t, Options{IPv4Portals: okSyncer{}, BindAddress: netip.MustParseAddr("0.0.0.0"), NodeName: "node1"})
	p.OnServiceAdd(svc)
	v6 := makeSlice("web", v1.ProtocolTCP, "[fd00:1::1]:8080")
	v6.Name, v6.AddressType = "web-v6", discovery.AddressTypeIPv6
	node := "node1"
	v6.Endpoints[0].NodeName = &node
	p.OnEndpointSliceAdd(v6)
	p.Sync()
	nn := types.NamespacedName{Namespace: "default", Name: "web"}
	for _, at := range []string{"10.0.0.1", "fd00:2::1"} {
		if n := p.LocalEndpointsAt(nn, netip.MustParseAddr(at)); n != 0 {
			t.Errorf("check on %s: %d local endpoints, want 0: IPv6 is not served on this node, the Service's one local pod is IPv6 only", at, n)
		}
	}
}
