package proxier

import (
	"errors"
	"maps"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// healthRecorder is a ServiceHealthSyncer that keeps every set it was
// handed and fails while fail is set.
type healthRecorder struct {
	calls []map[types.NamespacedName]int
	fail  bool
}

func (h *healthRecorder) SyncServices(ports map[types.NamespacedName]int) error {
	h.calls = append(h.calls, maps.Clone(ports))
	if h.fail {
		return errors.New("injected")
	}
	return nil
}

func localLB(name string, health int32) *v1.Service {
	svc := makeService(name, withNodePort(30080))
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = health
	return svc
}

// The health server hears of healthCheckNodePorts as Services come, change
// and go, and again after it failed, even when nothing changed since; a
// sync with nothing changed and nothing failed does not bother it.
func TestHealthCheckNodePortsFollowServices(t *testing.T) {
	h := &healthRecorder{}
	p := newTestProxier(t, Options{ServiceHealth: h, NodeName: "node1"})
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	last := func() map[types.NamespacedName]int {
		t.Helper()
		if len(h.calls) == 0 {
			t.Fatal("health server never called")
		}
		return h.calls[len(h.calls)-1]
	}
	p.OnServiceAdd(makeService("api", withClusterIP("10.96.0.20")))
	p.OnServiceAdd(localLB("web", 31000))
	p.Sync()
	if got := last(); !maps.Equal(got, map[types.NamespacedName]int{web: 31000}) {
		t.Fatalf("health ports %v, want web on 31000", got)
	}
	n := len(h.calls)
	p.Sync()
	if len(h.calls) != n {
		t.Errorf("an unchanged sync called the health server again")
	}

	h.fail = true
	p.OnServiceUpdate(nil, localLB("web", 31001))
	p.Sync()
	if !slices.Contains(p.lastFailed, "health check servers") || p.runner.retry == 0 {
		t.Errorf("a failed health server sync asked for no retry (left undone: %q)", p.lastFailed)
	}
	h.fail = false
	p.Sync() // nothing changed, but the last call failed
	if got := last(); !maps.Equal(got, map[types.NamespacedName]int{web: 31001}) {
		t.Fatalf("after a failure health ports %v, want web on 31001", got)
	}

	p.OnServiceDelete(localLB("web", 31001))
	p.Sync()
	if got := last(); len(got) != 0 {
		t.Fatalf("health ports %v after the Service went, want none", got)
	}
}

// The healthCheckNodePort's count of local endpoints is kube-proxy's
// (LocalReadyEndpoints): the distinct IPs of ready endpoints on this node
// over all the Service's ports, in one family (kube-proxy's per-family
// proxiers each count their own), so a load balancer weighs the node by
// its pods. The largest per-port count of ip:port endpoints, both families
// in one list, gave 1 for two pods that serve one port each and 2 for one
// dual-stack pod.
func TestHealthCheckCountsLocalPodsAsKubeProxy(t *testing.T) {
	p := newTestProxier(t, Options{NodeName: "node1"})
	svc := types.NamespacedName{Namespace: "default", Name: "web"}
	slice := func(name, port string, family discovery.AddressType, addrs ...string) *discovery.EndpointSlice {
		es := makeSlice("web", v1.ProtocolTCP, "10.0.0.250:80")
		es.Name, es.AddressType, es.Endpoints = name, family, nil
		es.Ports[0].Name = ptr.To(port)
		for _, a := range addrs {
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{a}, NodeName: ptr.To("node1"),
				Conditions: discovery.EndpointConditions{Ready: ptr.To(true)}})
		}
		return es
	}
	p.OnServiceAdd(makeService("web"))
	// Two pods, each serving one of the Service's two ports.
	p.OnEndpointSliceAdd(slice("web-http", "http", discovery.AddressTypeIPv4, "10.0.0.1"))
	p.OnEndpointSliceAdd(slice("web-https", "https", discovery.AddressTypeIPv4, "10.0.0.2"))
	if got := p.LocalEndpoints(svc); got != 2 {
		t.Errorf("two local pods on two ports: %d local endpoints, want 2", got)
	}
	// One dual-stack pod (and the IPv4 one of the other port).
	p.OnEndpointSliceDelete(slice("web-https", "https", discovery.AddressTypeIPv4, "10.0.0.2"))
	p.OnEndpointSliceAdd(slice("web-http6", "http", discovery.AddressTypeIPv6, "fd00::1"))
	if got := p.LocalEndpoints(svc); got != 1 {
		t.Errorf("one dual-stack local pod: %d local endpoints, want 1", got)
	}
}
