package e2ecp

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// etcdOutage is how long etcd stays down in TestEtcdOutage.
const etcdOutage = 15 * time.Second

// TestEtcdOutage stops etcd while kube-apiserver keeps running: the API server answers,
// but its /readyz fails and it can neither list nor write. The proxy keeps its watches
// (served from kube-apiserver's watch cache), so existing Services must keep answering
// and /healthz stay 200; once etcd is back, a change and a new Service must be served
// within resyncBudget of being written.
func TestEtcdOutage(t *testing.T) {
	e := setUp(t)
	ns := e.cp.Namespace(t)
	pod := e.pod(ipOutageBefore)
	svc, slice := createService(t, e.admin, newService(ns, "etcd-outage", 80, 53), readyEndpoints(e.backendIPs(0)...))
	dst := servicePort(t, svc, tcpPortName)
	pod.WaitServed(t, "tcp", dst, time.Now(), changePatience)

	health := watchHealthz(e.proxy, time.Now())
	e.cp.StopEtcd()
	began := time.Now()
	var failures []string
	probes := 0
	for time.Since(began) < etcdOutage {
		time.Sleep(time.Second)
		probes++
		if _, err := pod.Ask("tcp", dst, harness.AnswerTimeout); err != nil {
			failures = append(failures, fmt.Sprintf("at %v: %v", time.Since(began).Round(100*time.Millisecond), err))
		}
	}
	var err error
	e.launch.Run(func() { err = e.cp.StartEtcd() })
	if err != nil {
		t.Fatalf("restart etcd: %v", err)
	}
	if len(failures) > 0 {
		t.Errorf("the Service failed %d of %d times while etcd was down:\n%s", len(failures), probes, strings.Join(failures, "\n"))
	}

	// kube-apiserver takes writes again once it has reconnected to etcd.
	setEndpoints(slice, readyEndpoints(e.backendIPs(1)...))
	deadline := time.Now().Add(changePatience)
	for {
		if _, err = e.admin.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), slice, metav1.UpdateOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("update %s after etcd's return: %v", slice.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	changed := time.Now()
	s2 := e.backends[1].Name
	moved := pod.WaitFor(t, "tcp", dst, changed, resyncBudget, "answered by "+s2,
		func(name string, err error) bool { return err == nil && name == s2 })
	created := time.Now()
	after, _ := createService(t, e.admin, newService(ns, "after-etcd", 80, 53), readyEndpoints(e.backendIPs(2)...))
	served := e.pod(ipOutageAfter).WaitServed(t, "tcp", servicePort(t, after, tcpPortName), created, resyncBudget)
	n, bad := health.finish()
	t.Logf("FIGURE etcd outage: %d probes while etcd was down %v, %d failed; after its return an endpoint change was served in %d ms, a new Service in %d ms",
		probes, etcdOutage, len(failures), moved.Milliseconds(), served.Milliseconds())
	if len(bad) > 0 {
		t.Errorf("/healthz was not 200 in %d of %d probes:\n%s", len(bad), n, strings.Join(bad, "\n"))
	}
}
