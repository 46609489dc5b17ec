package config

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// TestApplyFileKeepsLastGood checks, without a watcher, which previous
// objects of a file survive a new version of it.
func TestApplyFileKeepsLastGood(t *testing.T) {
	const prev = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n---\n" +
		"apiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec: {ports: [{port: 5432}]}\n---\n" + endpointsYAML
	tests := []struct {
		name string
		next string
		want []string // delivered keys after the change, sorted
	}{
		{"everything removed", "", nil},
		{"web invalid keeps web", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 0}]}\n",
			[]string{"Service default/web"}},
		{"endpoints invalid keeps its slices", strings.Replace(endpointsYAML, "10.1.0.1", "bad", 1),
			[]string{"EndpointSlice default/web-subset0-ipv4", "EndpointSlice default/web-subset0-ipv6"}},
		{"misspelt kind keeps all", "apiVersion: v1\nkind: Servce\nmetadata: {name: web}\nspec: {ports: [{port: 81}]}\n", []string{
			"EndpointSlice default/web-subset0-ipv4", "EndpointSlice default/web-subset0-ipv6", "Service default/db", "Service default/web"}},
		{"unreadable document keeps all", "apiVersion: v1\nkind: [\n", []string{
			"EndpointSlice default/web-subset0-ipv4", "EndpointSlice default/web-subset0-ipv6", "Service default/db", "Service default/web"}},
		{"unreadable document beside a new version", "apiVersion: v1\nkind: [\n---\n" +
			"apiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec: {ports: [{port: 5433}]}\n", []string{
			"EndpointSlice default/web-subset0-ipv4", "EndpointSlice default/web-subset0-ipv6", "Service default/db", "Service default/web"}},
	}
	d := decoder{nodePorts: DefaultNodePortRange}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before, errs := d.applyFile("f.yaml", []byte(prev), nil)
			if len(errs) > 0 || len(before.objects) != 4 {
				t.Fatalf("setup: %d objects, errors %v", len(before.objects), errs)
			}
			after, _ := d.applyFile("f.yaml", []byte(tc.next), before)
			var got []string
			for _, o := range after.objects {
				got = append(got, o.key.String())
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// An object defined in two files is served from the first file in file
// order, whatever was served before: a restart, or another node, with the
// same files serves the same version. The running proxy kept the version it
// was serving when a file sorting first redefined it, and a restart then
// served the other one.
func TestDuplicateServedFromFilesAlone(t *testing.T) {
	tests := []struct {
		name   string
		key    string // recorder key
		first  string // a.yaml's definition, which must win
		second string // b.yaml's, served before a.yaml appears
		value  func(any) string
	}{
		{"Service", "Service default/web", serviceYAML("web", 81), serviceYAML("web", 80),
			func(o any) string { return strconv.Itoa(int(o.(*v1.Service).Spec.Ports[0].Port)) }},
		{"EndpointSlice", "EndpointSlice default/web-1", sliceYAML("web-1", "IPv4", "10.1.0.1"), sliceYAML("web-1", "IPv4", "10.2.0.2"),
			func(o any) string { return o.(*discovery.EndpointSlice).Endpoints[0].Addresses[0] }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
			start := func() (*ManifestSource, *manifestRecorder, *manifestErrors) {
				src, rec, log := manualSource(dir)
				src.reload()
				return src, rec, log
			}
			writeFile(t, b, tc.second)
			running, rec, log := start()
			rec.take()
			wantFirst := tc.value(mustDecodeOne(t, tc.first))

			// a.yaml sorts first: its version replaces the served one, as
			// an edit of the object.
			writeFile(t, a, tc.first)
			running.reload()
			if got, want := rec.take(), []string{"update " + tc.key}; !slices.Equal(got, want) {
				t.Errorf("events when a.yaml redefines it: %q, want %q", got, want)
			}
			if got := tc.value(rec.object(tc.key)); got != wantFirst {
				t.Errorf("running proxy serves %s, want a.yaml's %s", got, wantFirst)
			}
			dup := tc.key + " is defined twice: in " + a + " (document 1) and in " + b + " (document 1); using " + a + " (document 1)"
			if log.String() != "["+dup+"]" {
				t.Errorf("errors %s, want [%s]", log, dup)
			}

			// Polls with nothing changed repeat neither the line nor an event.
			running.reload()
			running.reload()
			if got := rec.take(); len(got) != 0 || log.String() != "["+dup+"]" {
				t.Errorf("after idle polls: events %q, errors %s", got, log)
			}

			// A fresh start on the same files serves the same.
			_, fresh, freshLog := start()
			if got := tc.value(fresh.object(tc.key)); got != wantFirst {
				t.Errorf("fresh start serves %s, want a.yaml's %s", got, wantFirst)
			}
			if freshLog.String() != "["+dup+"]" {
				t.Errorf("fresh start's errors %s, want [%s]", freshLog, dup)
			}

			// a.yaml gone: b.yaml's version is served again, as an edit.
			if err := os.Remove(a); err != nil {
				t.Fatal(err)
			}
			running.reload()
			if got, want := rec.take(), []string{"update " + tc.key}; !slices.Equal(got, want) {
				t.Errorf("events when a.yaml is removed: %q, want %q", got, want)
			}
			if got, want := tc.value(rec.object(tc.key)), tc.value(mustDecodeOne(t, tc.second)); got != want {
				t.Errorf("serves %s after a.yaml is removed, want b.yaml's %s", got, want)
			}
		})
	}
}

// mustDecodeOne decodes a one-object manifest.
func mustDecodeOne(t *testing.T, y string) any {
	t.Helper()
	st, errs := decoder{nodePorts: DefaultNodePortRange}.applyFile("x.yaml", []byte(y), nil)
	if len(errs) > 0 || len(st.objects) != 1 {
		t.Fatalf("decoding %q: %d objects, errors %v", y, len(st.objects), errs)
	}
	return st.objects[0].obj
}
