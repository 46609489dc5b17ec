package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// summaries collects the source's summary lines.
type summaries struct {
	mu    sync.Mutex
	lines []string
}

func (s *summaries) report(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, line)
}

func (s *summaries) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// waitLine waits for a line holding every part, returns it and forgets
// the lines up to it.
func (s *summaries) waitLine(t *testing.T, parts ...string) string {
	t.Helper()
	var found string
	defer func() {
		if found == "" {
			t.Logf("no summary holding %q among %q", parts, s.all())
		}
	}()
	eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, l := range s.lines {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(l, p)
			}
			if ok {
				found = l
				s.lines = s.lines[i+1:]
				return true
			}
		}
		return false
	})
	return found
}

// Nothing the manifests source does is silent: a summary at start (also for
// an empty directory) and after every reload that changed something, naming
// skipped files, files with errors, recovered files and what was added,
// updated and removed; a Service without clusterIP gets one from the range
// and the allocation is said.
func TestManifestSummaries(t *testing.T) {
	dir := t.TempDir()
	sum := &summaries{}
	rec, _ := startSource(t, dir, nil, WithSummaryReporter(sum.report))
	if got := sum.waitLine(t, dir+": 0 Services, 0 EndpointSlices from 0 files"); !strings.Contains(got, "no .yaml, .yml or .json file") {
		t.Errorf("empty directory summary %q does not say why nothing loaded", got)
	}

	writeFile(t, filepath.Join(dir, "README.md"), "notes")
	writeFile(t, filepath.Join(dir, ".draft.yaml"), serviceYAML("draft", 80))
	writeFile(t, filepath.Join(dir, "web.yaml"), serviceYAML("web", 80)+"---\n"+sliceYAML("web-1", "IPv4", "10.1.0.1"))
	rec.waitFor(t, liveWait, "add Service default/web", "add EndpointSlice default/web-1")
	sum.waitLine(t, "Service default/web has no clusterIP: allocated 10.", "from --service-cluster-ip-range 10.96.0.0/12")
	sum.waitLine(t, ": 1 Service, 1 EndpointSlice from 1 file", "added Service default/web, EndpointSlice default/web-1",
		"skipped .draft.yaml (hidden), README.md (not .yaml, .yml or .json)")
	ip := rec.serviceYAML("default/web").Spec.ClusterIP
	if a, err := netip.ParseAddr(ip); err != nil || !netip.MustParsePrefix("10.96.0.0/12").Contains(a) {
		t.Errorf("web delivered with clusterIP %q, want one in 10.96.0.0/12", ip)
	}

	writeFile(t, filepath.Join(dir, "web.yaml"), serviceYAML("web", 70000)+"---\n"+sliceYAML("web-1", "IPv4", "10.1.0.1"))
	sum.waitLine(t, ": 1 Service, 1 EndpointSlice from 1 file", "errors in web.yaml")
	writeFile(t, filepath.Join(dir, "web.yaml"), serviceYAML("web", 81)+"---\n"+sliceYAML("web-1", "IPv4", "10.1.0.1"))
	rec.waitFor(t, liveWait, "update Service default/web")
	got := sum.waitLine(t, "updated Service default/web", "recovered web.yaml")
	if strings.Contains(got, "errors in") {
		t.Errorf("fixed file still reported with errors: %q", got)
	}
	if now := rec.serviceYAML("default/web").Spec.ClusterIP; now != ip {
		t.Errorf("clusterIP moved from %s to %s on an update", ip, now)
	}

	writeFile(t, filepath.Join(dir, "web.yaml"), sliceYAML("web-1", "IPv4", "10.1.0.1"))
	rec.waitFor(t, liveWait, "delete Service default/web")
	sum.waitLine(t, ": 0 Services, 1 EndpointSlice from 1 file", "removed Service default/web")

	os.Remove(filepath.Join(dir, "README.md"))
	sum.waitLine(t, "skipped .draft.yaml (hidden)")
	if l := sum.all(); len(l) != 0 {
		t.Errorf("unexpected summaries %q", l)
	}
}

// A subdirectory is not read (no recursion), and the summary says so: it
// was listed as "sub (not .yaml, .yml or .json)", or, named sub.yaml, as
// "not a regular file", which sent the reader looking at its name.
func TestListFilesSaysDirectoriesAreNotRead(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"sub", "old.yaml", ".git"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("sub", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "README.md"), "notes")
	writeFile(t, filepath.Join(dir, "web.yaml"), serviceYAML("web", 80))
	src := NewManifestSource(dir, newManifestRecorder())
	src.dirMode = true
	names, _, skipped, err := src.listFiles()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "web.yaml")}; !slices.Equal(names, want) {
		t.Errorf("read %q, want %q", names, want)
	}
	var got []string
	for _, s := range skipped {
		got = append(got, s.name+" ("+s.why+")")
	}
	want := []string{".git (hidden)", "README.md (not .yaml, .yml or .json)", "link (a directory, not read)",
		"old.yaml (a directory, not read)", "sub (a directory, not read)"}
	if !slices.Equal(got, want) {
		t.Errorf("skipped %q, want %q", got, want)
	}
}

// A file that cannot be read (a named pipe, over the size cap, permission
// denied) is an error of that file, logged once; the summary's "errors in"
// now names it as it names a file that does not decode (it named only the
// latter: "from 2 files; errors in bad.yaml" beside an unreadable pipe.yaml),
// and stops naming it once it is read again or gone.
func TestSummaryNamesFilesThatCannotBeRead(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "web.yaml"), serviceYAML("web", 80))
	writeFile(t, filepath.Join(dir, "bad.yaml"), serviceYAML("bad", 70000))
	pipe := filepath.Join(dir, "pipe.yaml")
	if err := syscall.Mkfifo(pipe, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := &summaries{}
	src := NewManifestSource(dir, newManifestRecorder(), WithoutWatcher(), WithErrorReporter(func(error) {}), WithSummaryReporter(sum.report))
	src.dirMode = true
	src.reload()
	got := sum.waitLine(t, "from 3 files")
	if !strings.Contains(got, "errors in bad.yaml, pipe.yaml") {
		t.Errorf("summary %q does not name the unreadable pipe.yaml among the files with errors", got)
	}
	if err := os.Remove(pipe); err != nil {
		t.Fatal(err)
	}
	src.reload()
	got = sum.waitLine(t, "from 2 files")
	if strings.Contains(got, "pipe.yaml") {
		t.Errorf("summary %q still names pipe.yaml, which is gone", got)
	}
	if err := syscall.Mkfifo(pipe, 0o644); err != nil {
		t.Fatal(err)
	}
	src.reload()
	sum.waitLine(t, "from 3 files", "errors in bad.yaml, pipe.yaml")
	os.Remove(pipe)
	writeFile(t, pipe, serviceYAML("pipe", 80))
	src.reload()
	got = sum.waitLine(t, "from 3 files")
	if !strings.Contains(got, "errors in bad.yaml") || strings.Contains(got, "pipe.yaml,") || strings.Contains(got, ", pipe.yaml") {
		t.Errorf("summary %q: pipe.yaml, now a readable file, is still named with errors", got)
	}
}

// A v1 Endpoints is counted and named as the user wrote it, not as the
// EndpointSlices it is converted to: "1 Service, 2 EndpointSlices from 1
// file" was said of a Service and a dual-stack Endpoints (two slices), and
// its changes named the slices "default/web-subset0-ipv4" and "-ipv6".
func TestManifestSummaryNamesEndpoints(t *testing.T) {
	dir := t.TempDir()
	sum := &summaries{}
	writeFile(t, filepath.Join(dir, "web.yaml"), serviceYAML("web", 80)+"---\n"+endpointsYAML)
	startSource(t, dir, []string{"add Service default/web", "add EndpointSlice default/web-subset0-ipv4", "add EndpointSlice default/web-subset0-ipv6"},
		WithSummaryReporter(sum.report))
	sum.waitLine(t, dir+": 1 Service, 1 Endpoints from 1 file")

	writeFile(t, filepath.Join(dir, "web.yaml"), serviceYAML("web", 80)+"---\n"+strings.ReplaceAll(endpointsYAML, "10.1.0.1", "10.1.0.2"))
	writeFile(t, filepath.Join(dir, "api.yaml"), sliceYAML("api-1", "IPv4", "10.1.0.3"))
	got := sum.waitLine(t, ": 1 Service, 1 EndpointSlice, 1 Endpoints from 2 files", "added EndpointSlice default/api-1", "updated Endpoints default/web")
	if strings.Contains(got, "subset") {
		t.Errorf("summary names the converted slices: %q", got)
	}

	writeFile(t, filepath.Join(dir, "web.yaml"), serviceYAML("web", 80))
	got = sum.waitLine(t, ": 1 Service, 1 EndpointSlice from 2 files", "removed Endpoints default/web")
	if strings.Contains(got, "subset") || strings.Count(got, "Endpoints default/web") != 1 {
		t.Errorf("summary %q, want Endpoints default/web removed once", got)
	}
}

// Objects of kinds the proxy does not use are counted in the summary, by
// kind: a directory of an app's manifests (a Deployment, a ConfigMap, a
// List holding a Secret beside the Service) summarized as "1 Service, 0
// EndpointSlices from 1 file", the rest said at -v=2 only. A document kept
// from the file's last version (not decoded again) still counts.
func TestManifestSummaryCountsOtherKinds(t *testing.T) {
	dir := t.TempDir()
	sum := &summaries{}
	const deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n"
	const configMap = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\n"
	const secretList = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: web}}\n"
	writeFile(t, filepath.Join(dir, "app.yaml"), serviceYAML("web", 80)+"---\n"+deployment+"---\n"+configMap+"---\n"+secretList)
	startSource(t, dir, []string{"add Service default/web"}, WithSummaryReporter(sum.report))
	sum.waitLine(t, dir+": 1 Service, 0 EndpointSlices from 1 file; 3 objects of other kinds skipped (ConfigMap, Deployment, Secret): see -v=2")

	writeFile(t, filepath.Join(dir, "app.yaml"), serviceYAML("web", 81)+"---\n"+configMap)
	sum.waitLine(t, ": 1 Service, 0 EndpointSlices from 1 file; 1 object of another kind skipped (ConfigMap): see -v=2; updated Service default/web")

	writeFile(t, filepath.Join(dir, "app.yaml"), serviceYAML("web", 81))
	got := sum.waitLine(t, ": 1 Service, 0 EndpointSlices from 1 file")
	if strings.Contains(got, "kind") {
		t.Errorf("summary %q still counts an object of another kind, none left", got)
	}
}
