package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// writeServices writes n Services named svc-NNNNN, with clusterIP or without
// (allocated then), each with one EndpointSlice, over files files.
func writeServices(tb testing.TB, dir string, n, files int, named bool) {
	tb.Helper()
	for f := range files {
		var b strings.Builder
		for i := f * n / files; i < (f+1)*n/files; i++ {
			ip := ""
			if named {
				ip = fmt.Sprintf("\n  clusterIP: 10.%d.%d.%d", 96+i/65536, i/256%256, i%256)
			}
			fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: svc-%05d}\nspec:%s\n  ports: [{name: http, port: 80}]\n", i, ip)
			fmt.Fprintf(&b, "---\n%s", sliceYAML(fmt.Sprintf("svc-%05d-1", i), "IPv4", fmt.Sprintf("10.1.%d.%d", i/256%256, i%256)))
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d.yaml", f)), []byte(b.String()), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// newIdleSource is a source on dir that has read it once, driven by calling
// reload, as Run's poll does.
func newIdleSource(tb testing.TB, dir string, h Handler) *ManifestSource {
	tb.Helper()
	errs := &manifestErrors{}
	src := NewManifestSource(dir, h, WithoutWatcher(), WithErrorReporter(errs.report), WithSummaryReporter(func(string) {}))
	src.dirMode = true
	src.reload()
	if errs.String() != "[]" {
		tb.Fatalf("errors: %s", errs)
	}
	return src
}

// A poll that finds no file changed does nothing but read them: it ran the
// merge, the ClusterIP allocation (a fresh copy of every Service without
// clusterIP) and the comparison of every object, 140-210 ms of CPU every
// 5 s at 10,000 Services. Seen here as the objects served staying the very
// ones delivered.
func TestIdlePollKeepsServedObjects(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), serviceYAML("allocated", 80)+"---\n"+
		strings.Replace(serviceYAML("named", 81), "spec:\n", "spec:\n  clusterIP: 10.96.0.10\n", 1))
	rec := newManifestRecorder()
	src := newIdleSource(t, dir, rec)
	rec.take()
	before := map[objectKey]servedObject{}
	for k, o := range src.served {
		before[k] = o
	}

	src.reload()
	if got := rec.take(); len(got) != 0 {
		t.Errorf("events at an idle poll: %q", got)
	}
	for k, o := range src.served {
		if o.obj != before[k].obj {
			t.Errorf("%s: an idle poll made a new copy of it", k)
		}
	}
	if len(src.served) != len(before) {
		t.Errorf("served %d objects, then %d", len(before), len(src.served))
	}
}

// BenchmarkIdlePoll10k is one poll that finds none of 100 files of 10,000
// Services (no clusterIP: allocated) and their slices changed.
func BenchmarkIdlePoll10k(b *testing.B) {
	dir := b.TempDir()
	writeServices(b, dir, 10000, 100, false)
	src := newIdleSource(b, dir, newManifestRecorder())
	b.ReportAllocs()
	for b.Loop() {
		src.reload()
	}
}

// BenchmarkEditBigFile10k is the reload after one endpoint address changed
// in one file of 10,000 Services (named clusterIPs) and their slices.
func BenchmarkEditBigFile10k(b *testing.B) {
	dir := b.TempDir()
	writeServices(b, dir, 10000, 1, true)
	src := newIdleSource(b, dir, newManifestRecorder())
	path := filepath.Join(dir, "f000.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	versions := [2][]byte{
		[]byte(strings.Replace(string(data), `"10.1.0.7"`, `"10.2.0.7"`, 1)),
		data,
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := os.WriteFile(path, versions[i%2], 0o644); err != nil {
			b.Fatal(err)
		}
		i++
		src.reload()
	}
}

// An edit of one document of a file decodes that one: the others are taken
// from the last read (a file of 10,000 Services took 1.3-1.8 s to decode
// again, see BenchmarkEditBigFile10k), located where they are now.
func TestEditDecodesOnlyChangedDocuments(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "all.yaml")
	named := func(name string, port int) string {
		return strings.Replace(serviceYAML(name, port), "spec:\n", "spec:\n  clusterIP: 10.96.0."+fmt.Sprint(port-70)+"\n", 1)
	}
	writeFile(t, path, named("a", 80)+"---\n"+named("b", 81))
	rec := newManifestRecorder()
	src := newIdleSource(t, dir, rec)
	rec.take()
	a := src.served[objectKey{KindService, "default", "a"}]

	writeFile(t, path, named("c", 82)+"---\n"+named("a", 80)+"---\n"+named("b", 83))
	src.reload()
	if got, want := rec.take(), []string{"update Service default/b", "add Service default/c"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events %q, want %q", got, want)
	}
	now := src.served[objectKey{KindService, "default", "a"}]
	if now.obj != a.obj {
		t.Error("Service default/a, unchanged, was decoded again")
	}
	if now.doc != 2 || a.doc != 1 {
		t.Errorf("Service default/a located at document %d, then %d; want 1, then 2", a.doc, now.doc)
	}
}

// BenchmarkDecodeManifests10k decodes one file of 10,000 Services (named
// clusterIPs) and their slices cold, as a start or a rewrite of every
// document does.
func BenchmarkDecodeManifests10k(b *testing.B) {
	dir := b.TempDir()
	writeServices(b, dir, 10000, 1, true)
	data, err := os.ReadFile(filepath.Join(dir, "f000.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if ms, errs := DecodeManifests("f000.yaml", data); len(errs) > 0 || len(ms) != 20000 {
			b.Fatalf("%d objects, errors %v", len(ms), errs)
		}
	}
}

// BenchmarkDecodeList10k decodes the same 10,000 Services and slices as
// one JSON List document, as `kubectl get -o json` writes them.
func BenchmarkDecodeList10k(b *testing.B) {
	dir := b.TempDir()
	writeServices(b, dir, 10000, 1, true)
	data, err := os.ReadFile(filepath.Join(dir, "f000.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	var items []string
	for _, doc := range strings.Split(string(data), "\n---\n") {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			b.Fatal(err)
		}
		items = append(items, string(j))
	}
	list := []byte(`{"apiVersion":"v1","kind":"List","items":[` + strings.Join(items, ",") + `]}`)
	b.ReportAllocs()
	for b.Loop() {
		if ms, errs := DecodeManifests("list.json", list); len(errs) > 0 || len(ms) != 20000 {
			b.Fatalf("%d objects, errors %v", len(ms), errs)
		}
	}
}
