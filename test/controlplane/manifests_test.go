package controlplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/controlplane"
)

// deployDir is examples/deploy, relative to this package.
var deployDir = filepath.Join("..", "..", "examples", "deploy")

// readManifests decodes every document of every YAML file in dir.
func readManifests(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var obj map[string]any
			if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if obj != nil {
				objs = append(objs, &unstructured.Unstructured{Object: obj})
			}
		}
	}
	return objs
}

// apply server-side applies objs with strict field validation; dryRun leaves nothing
// stored.
func apply(t *testing.T, cp *controlplane.ControlPlane, objs []*unstructured.Unstructured, dryRun bool) {
	t.Helper()
	cfg := cp.AdminConfig()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc.Discovery()))
	opts := metav1.PatchOptions{FieldManager: "kup-test", FieldValidation: "Strict", Force: new(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk.Kind, obj.GetName(), err)
		}
		body, err := json.Marshal(obj.Object)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace()).
			Patch(ctx, obj.GetName(), types.ApplyPatchType, body, opts)
		cancel()
		if err != nil {
			t.Errorf("apply %s %s/%s (dry run %v): %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), dryRun, err)
		}
	}
}

func TestDeployManifestsDryRun(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	objs := readManifests(t, deployDir)
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"} {
		if !kinds[k] {
			t.Errorf("examples/deploy has no %s", k)
		}
	}
	apply(t, cp, objs, true)
}
