package proxier

import (
	"errors"
	"maps"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
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
