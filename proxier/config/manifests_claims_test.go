package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func withNodePorts(t v1.ServiceType, ports ...v1.ServicePort) svcOpt {
	return func(s *v1.Service) { s.Spec.Type, s.Spec.Ports = t, ports }
}

// placed is a Service as resolve hands it on: from a file and document.
func placed(file string, doc int, s *v1.Service) servedObject {
	k := objectKey{KindService, s.Namespace, s.Name}
	return servedObject{key: k, source: k, file: file, doc: doc, obj: s}
}

func byKey(objs ...servedObject) map[objectKey]servedObject {
	m := map[objectKey]servedObject{}
	for _, o := range objs {
		m[o.key] = o
	}
	return m
}

func TestResolveClaims(t *testing.T) {
	np := func(port, nodePort int32, proto v1.Protocol) v1.ServicePort {
		return v1.ServicePort{Name: strings.ToLower(string(proto)), Port: port, NodePort: nodePort, Protocol: proto}
	}
	tests := []struct {
		name            string
		desired, served []servedObject
		want            map[string]string // name → file of the version kept
		wantErrs        []string
	}{
		{name: "distinct",
			desired: []servedObject{placed("a.yaml", 1, svc("a", withIP("10.0.0.1"))), placed("b.yaml", 1, svc("b", withIP("10.0.0.2")))},
			want:    map[string]string{"a": "a.yaml", "b": "b.yaml"}},
		{name: "headless twice",
			desired: []servedObject{placed("a.yaml", 1, svc("a", withIP("None"))), placed("b.yaml", 1, svc("b", withIP("None")))},
			want:    map[string]string{"a": "a.yaml", "b": "b.yaml"}},
		{name: "same clusterIP: the first file keeps it",
			desired:  []servedObject{placed("b.yaml", 1, svc("b", withIP("10.0.0.1"))), placed("a.yaml", 1, svc("a", withIP("10.0.0.1")))},
			want:     map[string]string{"a": "a.yaml"},
			wantErrs: []string{"b.yaml: Service default/b: spec.clusterIP: clusterIP 10.0.0.1 is already used by Service default/a (a.yaml document 1)"}},
		{name: "same clusterIP in one file: the first document keeps it",
			desired:  []servedObject{placed("a.yaml", 2, svc("a", withIP("10.0.0.1"))), placed("a.yaml", 1, svc("b", withIP("10.0.0.1")))},
			want:     map[string]string{"b": "a.yaml"},
			wantErrs: []string{"a.yaml: Service default/a: spec.clusterIP: clusterIP 10.0.0.1 is already used by Service default/b (a.yaml document 1)"}},
		{name: "second family address of a dual-stack Service",
			desired:  []servedObject{placed("a.yaml", 1, svc("a", withIP("10.0.0.1", "fd00::1"))), placed("b.yaml", 1, svc("b", withIP("fd00:0::1")))},
			want:     map[string]string{"a": "a.yaml"},
			wantErrs: []string{"b.yaml: Service default/b: spec.clusterIP: clusterIP fd00::1 is already used by Service default/a (a.yaml document 1)"}},
		{name: "same nodePort, other protocol, other Service",
			desired: []servedObject{
				placed("a.yaml", 1, svc("a", withIP("10.0.0.1"), withNodePorts(v1.ServiceTypeNodePort, np(80, 30080, v1.ProtocolTCP)))),
				placed("b.yaml", 1, svc("b", withIP("10.0.0.2"), withNodePorts(v1.ServiceTypeLoadBalancer, np(53, 30081, v1.ProtocolTCP), np(53, 30080, v1.ProtocolUDP))))},
			want:     map[string]string{"a": "a.yaml"},
			wantErrs: []string{"b.yaml: Service default/b: spec.ports[1].nodePort: nodePort 30080 is already used by Service default/a (a.yaml document 1)"}},
		{name: "one nodePort for TCP and UDP of one Service",
			desired: []servedObject{placed("a.yaml", 1, svc("a", withIP("10.0.0.1"), withNodePorts(v1.ServiceTypeNodePort, np(53, 30053, v1.ProtocolTCP), np(53, 30053, v1.ProtocolUDP))))},
			want:    map[string]string{"a": "a.yaml"}},
		{name: "served Service keeps its address against a file that sorts first",
			served:   []servedObject{placed("b.yaml", 1, svc("b", withIP("10.0.0.1")))},
			desired:  []servedObject{placed("a.yaml", 1, svc("a", withIP("10.0.0.1"))), placed("b.yaml", 1, svc("b", withIP("10.0.0.1")))},
			want:     map[string]string{"b": "b.yaml"},
			wantErrs: []string{"a.yaml: Service default/a: spec.clusterIP: clusterIP 10.0.0.1 is already used by Service default/b (b.yaml document 1)"}},
		{name: "an edit onto another's address keeps the last good version",
			served:  []servedObject{placed("a.yaml", 1, svc("a", withIP("10.0.0.1"))), placed("b.yaml", 1, svc("b", withIP("10.0.0.2")))},
			desired: []servedObject{placed("a.yaml", 1, svc("a", withIP("10.0.0.2"))), placed("b.yaml", 1, svc("b", withIP("10.0.0.2")))},
			want:    map[string]string{"a": "a.yaml", "b": "b.yaml"},
			wantErrs: []string{"a.yaml: Service default/a: spec.clusterIP: clusterIP 10.0.0.2 is already used by Service default/b (b.yaml document 1); " +
				"keeping its last good version"}},
		{name: "a Service moving to a free address frees its old one only after",
			served:  []servedObject{placed("b.yaml", 1, svc("b", withIP("10.0.0.1")))},
			desired: []servedObject{placed("a.yaml", 1, svc("a", withIP("10.0.0.9"))), placed("b.yaml", 1, svc("b", withIP("10.0.0.2")))},
			want:    map[string]string{"a": "a.yaml", "b": "b.yaml"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			desired, served := byKey(tc.desired...), byKey(tc.served...)
			var got []string
			for _, e := range resolveClaims(desired, served) {
				got = append(got, e.Error())
			}
			if !slices.Equal(got, tc.wantErrs) {
				t.Errorf("errors:\n%q\nwant\n%q", got, tc.wantErrs)
			}
			kept := map[string]string{}
			for k, o := range desired {
				kept[k.Name] = o.file
			}
			if len(kept) != len(tc.want) {
				t.Errorf("kept %v, want %v", kept, tc.want)
			}
			for name, file := range tc.want {
				if kept[name] != file {
					t.Errorf("kept %v, want %v", kept, tc.want)
				}
			}
			if prev, ok := served[objectKey{KindService, "default", "a"}]; ok && len(tc.wantErrs) > 0 && strings.Contains(tc.wantErrs[0], "last good") {
				if desired[prev.key].obj != prev.obj {
					t.Errorf("a: not its served version")
				}
			}
		})
	}
}

// TestDuplicateClusterIPLive: a second file naming a served Service's
// clusterIP is an error naming it, and only the first Service is delivered.
func TestDuplicateClusterIPLive(t *testing.T) {
	dir := t.TempDir()
	withClusterIP := func(name string, port int) string {
		return strings.Replace(serviceYAML(name, port), "spec:\n", "spec:\n  clusterIP: 10.96.0.10\n", 1)
	}
	writeFile(t, filepath.Join(dir, "b.yaml"), withClusterIP("web", 80))
	rec, log := startSource(t, dir, []string{"add Service default/web"})

	writeFile(t, filepath.Join(dir, "a.yaml"), withClusterIP("other", 81)+"---\n"+serviceYAML("third", 82))
	rec.waitFor(t, liveWait, "add Service default/third")
	want := filepath.Join(dir, "a.yaml") + ": Service default/other: spec.clusterIP: clusterIP 10.96.0.10 is already used by Service default/web (" +
		filepath.Join(dir, "b.yaml") + " document 1)"
	if !log.contains(want) {
		t.Errorf("missing %q, got %s", want, log)
	}
	// Removing the holder frees the address for the other.
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, liveWait, "add Service default/other", "delete Service default/web")
}
