package controlplane_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/controlplane"
)

// TestInformerSourceListWithoutWatch: a ClusterRole that grants list but
// not watch on EndpointSlices. kube-proxy's reflectors fall back from the
// refused watch-list to a plain list, sync, and relist after each refused
// watch; the source held the refusal of its watch-list forever, so it
// never synced (and a proxy never served), logging only the refusal.
// Now it syncs once the refusal has outlasted refusedPatience (30 s), and
// changes arrive with the relists.
func TestInformerSourceListWithoutWatch(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	applyRBAC(t, cp)
	admin := cp.AdminClient(t)
	ctx := context.Background()
	role, err := admin.RbacV1().ClusterRoles().Get(ctx, "kube-userspace-proxy", metav1.GetOptions{})
	check(t, err)
	for i, r := range role.Rules {
		if len(r.Resources) == 1 && r.Resources[0] == "endpointslices" {
			role.Rules[i].Verbs = []string{"list"}
		}
	}
	_, err = admin.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{})
	check(t, err)
	proxy := proxyClient(t, cp)
	waitAllowed(t, proxy)
	deadline := time.Now().Add(30 * time.Second)
	for allowed(t, proxy, "watch", "discovery.k8s.io", "endpointslices") {
		if time.Now().After(deadline) {
			t.Fatal("watch on endpointslices is still allowed")
		}
		time.Sleep(100 * time.Millisecond)
	}

	ns := cp.Namespace(t)
	_, err = admin.CoreV1().Services(ns).Create(ctx, clusterIPService(ns, "web"), metav1.CreateOptions{})
	check(t, err)
	_, err = admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, "web-1", "web", nil), metav1.CreateOptions{})
	check(t, err)

	rec := &events{}
	runInformerSource(t, ctx, proxy, rec, config.InformerOptions{})
	began := time.Now()
	rec.waitFor(t, "slices synced", 90*time.Second)
	t.Logf("synced after %v", time.Since(began).Round(time.Millisecond))
	if !rec.has("slice add web-1") {
		t.Error(`no "slice add web-1"`)
	}
	_, err = admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, "web-2", "web", nil), metav1.CreateOptions{})
	check(t, err)
	created := time.Now()
	rec.waitFor(t, "slice add web-2", 150*time.Second)
	t.Logf("a slice created after the sync arrived after %v", time.Since(created).Round(time.Millisecond))
}
