package e2ecp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// deployRBAC is examples/deploy/rbac.yaml: what the proxy is allowed to do in a cluster.
const deployRBAC = "../../examples/deploy/rbac.yaml"

// rbacObjects are the identity and rights examples/deploy grants the proxy.
type rbacObjects struct {
	serviceAccounts []*v1.ServiceAccount
	roles           []*rbacv1.ClusterRole
	bindings        []*rbacv1.ClusterRoleBinding
}

// readRBAC decodes every document of a multi-document YAML file into the typed object
// its kind names; a kind it does not know is an error, so a new object in the file is
// not silently left out of the test.
func readRBAC(path string) (rbacObjects, error) {
	var objs rbacObjects
	data, err := os.ReadFile(path)
	if err != nil {
		return objs, err
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return objs, fmt.Errorf("%s: %w", filepath.Base(path), err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return objs, fmt.Errorf("%s: %w", filepath.Base(path), err)
		}
		var target any
		switch meta.Kind {
		case "":
			continue // a comment-only document
		case "ServiceAccount":
			o := &v1.ServiceAccount{}
			objs.serviceAccounts, target = append(objs.serviceAccounts, o), o
		case "ClusterRole":
			o := &rbacv1.ClusterRole{}
			objs.roles, target = append(objs.roles, o), o
		case "ClusterRoleBinding":
			o := &rbacv1.ClusterRoleBinding{}
			objs.bindings, target = append(objs.bindings, o), o
		default:
			return objs, fmt.Errorf("%s: unexpected kind %q", filepath.Base(path), meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, target); err != nil {
			return objs, fmt.Errorf("%s: %s: %w", filepath.Base(path), meta.Kind, err)
		}
	}
}

// applyRBAC creates examples/deploy's ServiceAccount, ClusterRole and binding with the
// admin client and waits until the API server's authorizer lets the proxy token list
// Services, so that the proxy starts with its rights in place.
func applyRBAC(t *testing.T, admin, proxy kubernetes.Interface) {
	t.Helper()
	objs, err := readRBAC(deployRBAC)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	create := func(what string, err error) {
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %s: %v", what, err)
		}
	}
	for _, o := range objs.serviceAccounts {
		_, err := admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		create("ServiceAccount "+o.Name, err)
	}
	for _, o := range objs.roles {
		_, err := admin.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		create("ClusterRole "+o.Name, err)
	}
	for _, o := range objs.bindings {
		_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		create("ClusterRoleBinding "+o.Name, err)
	}
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "watch", Group: "discovery.k8s.io", Resource: "endpointslices"},
	}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := proxy.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err == nil && got.Status.Allowed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy token was never allowed to watch endpointslices (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
