package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	testclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"
)

// liveWait bounds how long a test waits for a change: the contract is 1 s.
const liveWait = 2 * time.Second

func serviceYAML(name string, port int) string {
	return "apiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec:\n  ports: [{port: " + strconv.Itoa(port) + "}]\n"
}

func yamlToJSON(t *testing.T, y string) string {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return string(j)
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeAtomic writes data beside path and renames it into place, as editors
// and ConfigMap updaters do.
func writeAtomic(t *testing.T, path, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	writeFile(t, tmp, data)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// manualSource is a source of path's manifests that runs no loop and
// watches nothing: the test calls reload and dropGone itself. Its errors
// go to log and its summaries nowhere; opts come after those and may
// replace them.
func manualSource(path string, opts ...Option) (*ManifestSource, *manifestRecorder, *manifestErrors) {
	rec, log := newManifestRecorder(), &manifestErrors{}
	src := NewManifestSource(path, rec, append([]Option{WithoutWatcher(), WithErrorReporter(log.report), WithSummaryReporter(func(string) {})}, opts...)...)
	if info, err := os.Stat(path); err == nil {
		src.dirMode = info.IsDir() // as Run sets it
	}
	return src, rec, log
}

// start runs a source on path until the test ends and waits for the initial sync.
func startSource(t *testing.T, path string, initial []string, opts ...Option) (*manifestRecorder, *manifestErrors) {
	t.Helper()
	rec, log := newManifestRecorder(), &manifestErrors{}
	src := NewManifestSource(path, rec, append([]Option{WithErrorReporter(log.report)}, opts...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	})
	want := append(initial, "synced Service", "synced EndpointSlice")
	rec.waitFor(t, liveWait, want...)
	return rec, log
}

func TestRunMissingPath(t *testing.T) {
	src := NewManifestSource(filepath.Join(t.TempDir(), "nope"), newManifestRecorder())
	if err := src.Run(context.Background()); err == nil {
		t.Fatal("Run on a missing path returned nil")
	}
}

func TestDirectoryLiveChanges(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), serviceYAML("a", 80)+"---\n"+sliceYAML("web-1", "IPv4", "10.1.0.1"))
	writeFile(t, filepath.Join(dir, "notes.txt"), "not a manifest")
	rec, log := startSource(t, dir, []string{"add Service default/a", "add EndpointSlice default/web-1"})

	steps := []struct {
		name   string
		change func()
		want   []string
	}{
		{"write a new file", func() { writeFile(t, filepath.Join(dir, "b.yml"), serviceYAML("b", 81)) },
			[]string{"add Service default/b"}},
		{"rename a changed file into place", func() { writeAtomic(t, filepath.Join(dir, "b.yml"), serviceYAML("b", 82)) },
			[]string{"update Service default/b"}},
		{"rewrite unchanged content then change a", func() {
			writeFile(t, filepath.Join(dir, "b.yml"), serviceYAML("b", 82))
			writeFile(t, filepath.Join(dir, "a.yaml"), serviceYAML("a", 80)+"---\n"+sliceYAML("web-1", "IPv4", "10.1.0.2"))
		}, []string{"update EndpointSlice default/web-1"}},
		{"delete a file", func() { os.Remove(filepath.Join(dir, "b.yml")) },
			[]string{"delete Service default/b"}},
		{"create an Endpoints file", func() { writeFile(t, filepath.Join(dir, "c.json"), yamlToJSON(t, endpointsYAML)) },
			[]string{"add EndpointSlice default/web-subset0-ipv4", "add EndpointSlice default/web-subset0-ipv6"}},
	}
	for _, s := range steps {
		begin := time.Now()
		s.change()
		rec.waitFor(t, liveWait, s.want...)
		if took := time.Since(begin); took > time.Second {
			t.Errorf("%s: took %v, want within 1 s", s.name, took)
		}
	}
	if got := rec.serviceYAML("default/b"); got != nil {
		t.Errorf("deleted service still recorded: %v", got.Name)
	}
	if log.String() != "[]" {
		t.Errorf("unexpected errors: %s", log)
	}
}

func TestSingleFileMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "svc.yaml")
	writeFile(t, path, serviceYAML("a", 80))
	writeFile(t, filepath.Join(dir, "other.yaml"), serviceYAML("other", 80)) // not watched
	rec, log := startSource(t, path, []string{"add Service default/a"}, withEmptiedGrace(200*time.Millisecond))

	writeAtomic(t, path, serviceYAML("a", 81)+"---\n"+serviceYAML("b", 80))
	rec.waitFor(t, liveWait, "update Service default/a", "add Service default/b")
	if p := rec.serviceYAML("default/a").Spec.Ports[0].Port; p != 81 {
		t.Errorf("port %d, want 81", p)
	}
	// The file gone keeps its last good objects serving, as a directory
	// gone does; back, it is read again. Emptied, it serves nothing once
	// the grace for a file being rewritten in place has passed.
	os.Remove(path)
	eventually(t, func() bool {
		return log.contains(path + ": stat " + path + ": no such file or directory (keeping its last good objects)")
	})
	if got := rec.take(); len(got) != 0 {
		t.Errorf("events after the file was removed: %q", got)
	}
	writeFile(t, path, serviceYAML("a", 80))
	rec.waitFor(t, liveWait, "update Service default/a", "delete Service default/b")
	writeAtomic(t, path, "")
	rec.waitFor(t, liveWait, "delete Service default/a")
}

func TestInvalidEditKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "svc.yaml")
	writeFile(t, path, serviceYAML("web", 80)+"---\n"+serviceYAML("db", 5432))
	rec, log := startSource(t, dir, []string{"add Service default/db", "add Service default/web"})

	// web becomes invalid, db changes: db is updated, web keeps serving port 80.
	writeFile(t, path, serviceYAML("web", 70000)+"---\n"+serviceYAML("db", 5433))
	rec.waitFor(t, liveWait, "update Service default/db")
	if !log.contains(path + ": Service default/web: spec.ports[0].port: 70000 is out of range 1-65535") {
		t.Errorf("missing error, got %s", log)
	}
	if p := rec.serviceYAML("default/web").Spec.Ports[0].Port; p != 80 {
		t.Errorf("web port %d, want last good 80", p)
	}

	// A file that does not parse keeps all of its objects.
	writeFile(t, path, "apiVersion: v1\nkind: [\n")
	eventually(t, func() bool { return log.contains("document 1 (line 1)") })
	// Fixing web brings its new version; db is unchanged.
	writeFile(t, path, serviceYAML("web", 8080)+"---\n"+serviceYAML("db", 5433))
	rec.waitFor(t, liveWait, "update Service default/web")
	if got := rec.take(); len(got) != 0 {
		t.Errorf("unexpected events %q", got)
	}
}

// Live, through the watcher: a file sorting first that redefines a served
// object takes it over, as an edit (see TestDuplicateServedFromFilesAlone).
func TestDuplicateFirstWins(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "b.yaml"), serviceYAML("web", 80))
	rec, log := startSource(t, dir, []string{"add Service default/web"})

	writeFile(t, filepath.Join(dir, "a.yaml"), serviceYAML("web", 81))
	rec.waitFor(t, liveWait, "update Service default/web")
	if !log.contains("Service default/web is defined twice") || !log.contains("using "+filepath.Join(dir, "a.yaml")) {
		t.Errorf("duplicate error should use a.yaml: %s", log)
	}
	if p := rec.serviceYAML("default/web").Spec.Ports[0].Port; p != 81 {
		t.Errorf("port %d, want 81 from a.yaml", p)
	}
	os.Remove(filepath.Join(dir, "a.yaml"))
	rec.waitFor(t, liveWait, "update Service default/web")
	if p := rec.serviceYAML("default/web").Spec.Ports[0].Port; p != 80 {
		t.Errorf("port %d, want 80 from b.yaml", p)
	}
}

// TestPollFallback runs without fsnotify on a fake clock: a change is seen
// at the next poll tick.
func TestPollFallback(t *testing.T) {
	dir := t.TempDir()
	clk := testclock.NewFakeClock(time.Now())
	rec, _ := startSource(t, dir, nil, WithoutWatcher(), WithClock(clk), WithPollInterval(time.Minute))
	writeFile(t, filepath.Join(dir, "a.yaml"), serviceYAML("a", 80))
	eventually(t, clk.HasWaiters)
	clk.Step(time.Minute)
	rec.waitFor(t, liveWait, "add Service default/a")
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(liveWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A file made while a reload lists the directory (here, the first one) is
// seen at once: the directory is watched before the listing. It was
// watched only after it, so such a file waited for the next poll (5 s in
// the binary; a test writing its first manifest as the proxy started saw
// 5.003 s once).
func TestFileMadeWhileListingIsSeen(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), serviceYAML("a", 80))
	rec, log := newManifestRecorder(), &manifestErrors{}
	src := NewManifestSource(dir, rec, WithErrorReporter(log.report), WithPollInterval(time.Hour))
	var once sync.Once
	src.afterList = func() {
		once.Do(func() { writeFile(t, filepath.Join(dir, "b.yaml"), serviceYAML("b", 80)) })
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	rec.waitFor(t, liveWait, "add Service default/a", "synced Service", "synced EndpointSlice")
	rec.waitFor(t, liveWait, "add Service default/b")
	if log.String() != "[]" {
		t.Errorf("unexpected errors: %s", log)
	}
}

// A Service labelled service.kubernetes.io/service-proxy-name belongs to
// another proxy, and the slices labelled service.kubernetes.io/headless to
// a headless Service: kube-proxy's informers, and ours, never list them
// (ProxyLabelSelector). The manifests source served them.
func TestManifestsLeaveOtherProxiesObjects(t *testing.T) {
	dir := t.TempDir()
	other := "apiVersion: v1\nkind: Service\nmetadata:\n  name: other\n  labels: {service.kubernetes.io/service-proxy-name: cilium}\nspec:\n  ports: [{port: 80}]\n"
	headlessSlice := strings.Replace(sliceYAML("headless-1", "IPv4", "10.1.0.9"), "  labels:\n", "  labels:\n    service.kubernetes.io/headless: \"\"\n", 1)
	writeFile(t, filepath.Join(dir, "a.yaml"), other+"---\n"+serviceYAML("mine", 81)+"---\n"+headlessSlice)
	rec, log := startSource(t, dir, []string{"add Service default/mine"})

	// The label taken off: the Service is ours from then on; put on: it goes.
	writeFile(t, filepath.Join(dir, "a.yaml"), serviceYAML("other", 80)+"---\n"+strings.Replace(other, "name: other", "name: mine", 1)+"---\n"+headlessSlice)
	rec.waitFor(t, liveWait, "delete Service default/mine", "add Service default/other")
	if log.String() != "[]" {
		t.Errorf("unexpected errors: %s", log)
	}
}
