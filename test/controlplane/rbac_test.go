package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/controlplane"
)

// applyRBAC stores examples/deploy's ServiceAccount, ClusterRole and binding for real, so
// that the proxy token gets exactly the rights the deployment grants.
func applyRBAC(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	var rbac []*unstructured.Unstructured
	for _, o := range readManifests(t, deployDir) {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding":
			rbac = append(rbac, o)
		}
	}
	apply(t, cp, rbac, false)
}

// proxyClient returns a clientset with the proxy token.
func proxyClient(t *testing.T, cp *controlplane.ControlPlane) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cp.ProxyConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// allowed asks the API server whether the caller of c may do verb on group/resource.
func allowed(t *testing.T, c kubernetes.Interface, verb, group, resource string) bool {
	t.Helper()
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource},
	}}
	got, err := c.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), review, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("access review %s %s: %v", verb, resource, err)
	}
	return got.Status.Allowed
}

func TestProxyRoleIsLeastPrivilege(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	applyRBAC(t, cp)
	proxy := proxyClient(t, cp)
	waitAllowed(t, proxy)

	tests := []struct {
		verb, group, resource string
		want                  bool
	}{
		{"list", "", "services", true},
		{"watch", "", "services", true},
		{"list", "discovery.k8s.io", "endpointslices", true},
		{"watch", "discovery.k8s.io", "endpointslices", true},
		{"get", "", "nodes", true},
		{"list", "", "nodes", true},
		{"watch", "", "nodes", true},
		{"create", "", "events", true},
		{"patch", "", "events", true},
		{"create", "events.k8s.io", "events", true},
		{"patch", "events.k8s.io", "events", true},
		// Nothing more.
		{"create", "", "services", false},
		{"update", "", "services", false},
		{"create", "discovery.k8s.io", "endpointslices", false},
		{"update", "", "nodes", false},
		{"patch", "", "nodes", false},
		{"list", "", "secrets", false},
		{"list", "", "pods", false},
		{"list", "", "endpoints", false},
		{"delete", "", "events", false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %s.%s", tt.verb, tt.resource, tt.group), func(t *testing.T) {
			if got := allowed(t, proxy, tt.verb, tt.group, tt.resource); got != tt.want {
				t.Errorf("allowed = %v, want %v", got, tt.want)
			}
		})
	}
}

// waitAllowed waits until the RBAC objects just stored have reached the authorizer.
func waitAllowed(t *testing.T, proxy kubernetes.Interface) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !allowed(t, proxy, "list", "", "services") {
		if time.Now().After(deadline) {
			t.Fatal("the proxy role never took effect")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
