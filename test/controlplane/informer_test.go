package controlplane_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/controlplane"
)

// events records what an InformerSource delivers, one line per call.
type events struct {
	mu    sync.Mutex
	lines []string
	node  config.NodeInfo
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lines = append(e.lines, fmt.Sprintf(format, args...))
}

func (e *events) OnServiceAdd(s *v1.Service)       { e.add("svc add %s", s.Name) }
func (e *events) OnServiceUpdate(_, s *v1.Service) { e.add("svc update %s", s.Name) }
func (e *events) OnServiceDelete(s *v1.Service)    { e.add("svc delete %s", s.Name) }
func (e *events) OnServiceSynced()                 { e.add("svc synced") }
func (e *events) OnEndpointSliceAdd(es *discovery.EndpointSlice) {
	e.add("slice add %s", es.Name)
}
func (e *events) OnEndpointSliceUpdate(_, es *discovery.EndpointSlice) {
	e.add("slice update %s", es.Name)
}
func (e *events) OnEndpointSliceDelete(es *discovery.EndpointSlice) {
	e.add("slice delete %s", es.Name)
}
func (e *events) OnEndpointSlicesSynced() { e.add("slices synced") }
func (e *events) OnNodeChange(n config.NodeInfo) {
	e.mu.Lock()
	e.node = n
	e.mu.Unlock()
	e.add("node %s", n.Name)
}
func (e *events) OnNodeSynced() { e.add("node synced") }

func (e *events) has(line string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Contains(e.lines, line)
}

// waitFor polls for line (a real API server is on the other side: no fake clock).
func (e *events) waitFor(t *testing.T, line string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !e.has(line) {
		if time.Now().After(deadline) {
			e.mu.Lock()
			defer e.mu.Unlock()
			t.Fatalf("no %q after %v; got %q", line, timeout, e.lines)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runInformerSource runs the informer source of client into rec until
// the test ends, and fails the test if Run then returns an error.
func runInformerSource(t *testing.T, ctx context.Context, client kubernetes.Interface, rec *events, opts config.InformerOptions) {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- config.NewInformerSource(client, rec, opts).Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func clusterIPService(ns, name string, mutate ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.ServiceSpec{Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

func endpointSlice(ns, name, service string, labels map[string]string) *discovery.EndpointSlice {
	l := map[string]string{discovery.LabelServiceName: service}
	for k, v := range labels {
		l[k] = v
	}
	return &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l},
		AddressType: discovery.AddressTypeIPv4,
		// Not loopback: the API server refuses 127.0.0.0/8 endpoints.
		Endpoints: []discovery.Endpoint{{Addresses: []string{"10.244.0.5"}}},
		Ports:     []discovery.EndpointPort{{Port: new(int32(8080)), Protocol: new(v1.ProtocolTCP)}},
	}
}

// createNode stores a Node with an address and a zone, as a kubelet would.
func createNode(t *testing.T, admin kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	node, err := admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{v1.LabelTopologyZone: "zone-a"},
	}}, metav1.CreateOptions{})
	check(t, err)
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.50.2"}}
	_, err = admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	check(t, err)
}

// TestInformerSourceWithProxyRole runs the informer source with the deployment's RBAC
// against the real API server, through an API-server restart.
func TestInformerSourceWithProxyRole(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	applyRBAC(t, cp)
	proxy := proxyClient(t, cp)
	waitAllowed(t, proxy)
	admin := cp.AdminClient(t)
	ctx := context.Background()

	ns := cp.Namespace(t)
	createNode(t, admin, "node-1")
	for _, s := range []*v1.Service{
		clusterIPService(ns, "web"),
		clusterIPService(ns, "headless", func(s *v1.Service) { s.Spec.ClusterIP = v1.ClusterIPNone }),
		clusterIPService(ns, "external", func(s *v1.Service) {
			s.Spec.Type, s.Spec.ExternalName, s.Spec.Ports = v1.ServiceTypeExternalName, "example.com", nil
		}),
		clusterIPService(ns, "other-proxy", func(s *v1.Service) {
			s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"}
		}),
	} {
		_, err := admin.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{})
		check(t, err)
	}
	for _, es := range []*discovery.EndpointSlice{
		endpointSlice(ns, "web-1", "web", nil),
		endpointSlice(ns, "headless-1", "headless", map[string]string{"service.kubernetes.io/headless": ""}),
	} {
		_, err := admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{})
		check(t, err)
	}

	rec := &events{}
	runInformerSource(t, ctx, proxy, rec, config.InformerOptions{NodeName: "node-1", NodeHandler: rec})

	rec.waitFor(t, "slices synced", 30*time.Second)
	rec.waitFor(t, "node synced", 30*time.Second)
	for _, want := range []string{"svc add web", "slice add web-1"} {
		if !rec.has(want) {
			t.Errorf("no %q", want)
		}
	}
	for _, unwanted := range []string{"svc add headless", "svc add external", "svc add other-proxy", "slice add headless-1"} {
		if rec.has(unwanted) {
			t.Errorf("unexpected %q", unwanted)
		}
	}
	rec.mu.Lock()
	node := rec.node
	rec.mu.Unlock()
	if node.Zone != "zone-a" || len(node.Addresses) != 1 || node.Addresses[0].String() != "192.168.50.2" {
		t.Errorf("node = %+v, want zone-a with 192.168.50.2", node)
	}

	// explain's source (Unproxied) is given the headless and ExternalName
	// Services too, through the same label selector and role: the API
	// server leaves out only another proxy's Service and the headless
	// slices (that label is the EndpointSlice controller's, on slices, not
	// on the Service).
	explainCtx, stopExplain := context.WithCancel(ctx)
	all := &events{}
	runInformerSource(t, explainCtx, proxy, all, config.InformerOptions{Unproxied: true})
	all.waitFor(t, "slices synced", 30*time.Second)
	for _, want := range []string{"svc add web", "svc add headless", "svc add external", "slice add web-1"} {
		if !all.has(want) {
			t.Errorf("Unproxied: no %q", want)
		}
	}
	for _, unwanted := range []string{"svc add other-proxy", "slice add headless-1"} {
		if all.has(unwanted) {
			t.Errorf("Unproxied: unexpected %q", unwanted)
		}
	}
	stopExplain()

	// A short outage: the source must survive it and resync.
	cp.StopAPIServer()
	time.Sleep(2 * time.Second) // let the watches notice
	restart := time.Now()
	if err := cp.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver ready again after %v", time.Since(restart).Round(time.Millisecond))
	created := time.Now()
	_, err := admin.CoreV1().Services(ns).Create(ctx, clusterIPService(ns, "after-restart"), metav1.CreateOptions{})
	check(t, err)
	rec.waitFor(t, "svc add after-restart", 60*time.Second)
	t.Logf("Service created after the restart delivered after %v", time.Since(created).Round(time.Millisecond))
}
