package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// addManifestSeeds seeds a fuzz target with the example manifests and the
// shapes the decoder tests cover (lists, streams, broken documents).
func addManifestSeeds(f *testing.F) {
	f.Helper()
	for _, dir := range []string{"../../examples/manifests", "../../examples/faults"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, name := range files {
			if data, err := os.ReadFile(name); err == nil {
				f.Add(data)
			}
		}
	}
	for _, s := range []string{
		svcHead + "  ports: [{port: 80}]\n",
		svcHead + "  type: NodePort\n  ports: [{port: 80, nodePort: 30080}]\n",
		svcHead + "  clusterIPs: [10.0.0.1, 'fd00::1']\n  ports: [{port: 80}]\n",
		svcHead + "  sessionAffinity: ClientIP\n  ports: [{port: 80}]\n",
		svcHead + "  ports: [{port: 70000}]\n",
		sliceYAML("web-1", "IPv4", "10.1.0.1"),
		sliceYAML("web-1", "IPv6", "fd00::1"),
		endpointsYAML,
		"apiVersion: v1\nkind: ServiceList\nitems:\n- metadata: {name: a}\n  spec: {ports: [{port: 80}]}\n",
		`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":80}]}}]}`,
		`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"List","items":[]}]}`,
		`{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":80}]}}{"apiVersion": "v1", "kind": `,
		"metadata: {name: x}\n",
		"apiVersion: v1\nkind: Servce\nmetadata: {name: web}\n---\nkind: service\n---\napiVersion: apps/v1\nkind: Deployment\n",
		"apiVersion: v1\nkind: [\n",
		"--- b\n",
		"",
	} {
		f.Add([]byte(s))
	}
}

// FuzzDecodeManifests: no input panics the manifest decoder; every problem
// is a one-line *ManifestError that names the file and the object or the
// document it is about; every object that comes back passes validation
// again and survives a JSON and a YAML round trip unchanged (decoding is
// idempotent: defaulting a defaulted object changes nothing).
func FuzzDecodeManifests(f *testing.F) {
	addManifestSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		ms, errs := DecodeManifests("in.yaml", data)
		for _, err := range errs {
			checkManifestError(t, err)
		}
		for _, m := range ms {
			checkManifest(t, m)
		}
	})
}

// checkManifestError fails unless err is a clear, located ManifestError.
func checkManifestError(t *testing.T, err error) {
	t.Helper()
	var merr *ManifestError
	if !errors.As(err, &merr) {
		t.Fatalf("error %T is not a *ManifestError: %v", err, err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "in.yaml: ") {
		t.Fatalf("error does not name the file: %q", msg)
	}
	if strings.ContainsAny(msg, "\n\r") {
		t.Fatalf("error spans lines: %q", msg)
	}
	if !merr.Identified() && merr.Doc < 1 {
		t.Fatalf("error names neither an object nor a document: %q", msg)
	}
	if merr.Err == nil || strings.TrimSpace(merr.Err.Error()) == "" {
		t.Fatalf("error says nothing about what is wrong: %q", msg)
	}
}

// checkManifest checks a decoded object's own invariants and round trips.
func checkManifest(t *testing.T, m Manifest) {
	t.Helper()
	want, known := apiVersions[m.Kind]
	if !known || m.Object == nil || m.Name == "" || m.Namespace == "" {
		t.Fatalf("decoded manifest is incomplete: %+v", m)
	}
	if err := validate(m.Object, DefaultNodePortRange); err != nil {
		t.Fatalf("decoded %s %s/%s fails validation again: %v", m.Kind, m.Namespace, m.Name, err)
	}
	// Items of a typed list may omit apiVersion and kind; say them, as a
	// file holding the object alone would.
	obj := m.Object.DeepCopyObject()
	// Times print to the second (RFC 3339, as the API server stores
	// them): a file's fraction of a second is gone after one round trip,
	// and rightly; the proxy reads none of them.
	clearTimes(reflect.ValueOf(obj))
	obj.GetObjectKind().SetGroupVersionKind(schema.FromAPIVersionAndKind(want, m.Kind))
	j, err := json.Marshal(obj)
	if err != nil {
		t.Fatalf("marshal %s: %v", m.Kind, err)
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		t.Fatalf("to YAML: %v", err)
	}
	for form, text := range map[string][]byte{"JSON": j, "YAML": y} {
		again, errs := DecodeManifests("again", text)
		if len(errs) > 0 || len(again) != 1 {
			t.Fatalf("%s round trip of %s %s/%s: %d objects, errors %v\n%s", form, m.Kind, m.Namespace, m.Name, len(again), errs, text)
		}
		if !sameObject(obj, again[0].Object) {
			t.Fatalf("%s round trip changed %s %s/%s:\nfirst:  %s\nagain: %s", form, m.Kind, m.Namespace, m.Name, j, mustJSON(again[0].Object))
		}
	}
}

// clearTimes zeroes every metav1.Time v holds (nil for a *metav1.Time):
// a creationTimestamp of "2020-01-01T00:00:00.5Z" printed again as
// "2020-01-01T00:00:00Z" made the round trip look changed.
func clearTimes(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		switch {
		case v.IsNil():
		case v.Type().Elem() == timeType && v.CanSet():
			v.Set(reflect.Zero(v.Type()))
		default:
			clearTimes(v.Elem())
		}
	case reflect.Interface:
		if !v.IsNil() {
			clearTimes(v.Elem())
		}
	case reflect.Struct:
		if v.Type() == timeType {
			if v.CanSet() {
				v.Set(reflect.Zero(timeType))
			}
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				clearTimes(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			clearTimes(v.Index(i))
		}
	}
}

var timeType = reflect.TypeFor[metav1.Time]()

func sameObject(a, b runtime.Object) bool {
	b = b.DeepCopyObject()
	b.GetObjectKind().SetGroupVersionKind(a.GetObjectKind().GroupVersionKind())
	return equality.Semantic.DeepEqual(a, b)
}

func mustJSON(o runtime.Object) []byte {
	j, _ := json.Marshal(o)
	return j
}
