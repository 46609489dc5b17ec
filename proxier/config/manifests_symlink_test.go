package config

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// repoint makes link point at target atomically, as kubelet swaps a
// ConfigMap volume's ..data and as `ln -sfn` through a rename does.
func repoint(t *testing.T, link, target string) {
	t.Helper()
	tmp := link + ".tmp"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// configMapVolume lays dir out as kubelet does a ConfigMap volume: the data
// in a timestamped directory, ..data pointing at it, and each key a symlink
// through ..data. Every call is one update: a new directory, ..data swapped,
// the old directory removed.
func configMapVolume(t *testing.T, dir string, gen int, files map[string]string) {
	t.Helper()
	data := filepath.Join(dir, "..2026_01_01_00_00_0"+strconv.Itoa(gen))
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		writeFile(t, filepath.Join(data, name), content)
		if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	repoint(t, filepath.Join(dir, "..data"), filepath.Base(data))
	if old != "" {
		os.RemoveAll(filepath.Join(dir, old))
	}
}

// TestSymlinkedPathFollowsRepoint: a change behind a re-pointed symlink is
// seen within the 1 s contract (the poll is an hour here), however the
// manifests reach it.
func TestSymlinkedPathFollowsRepoint(t *testing.T) {
	tests := []struct {
		name string
		// setup lays out generation 1 under root and returns --manifests.
		setup func(t *testing.T, root string) string
		// update brings generation gen (web on port 80+gen).
		update func(t *testing.T, root string, gen int)
	}{
		{"ConfigMap volume as the directory",
			func(t *testing.T, root string) string {
				configMapVolume(t, root, 1, map[string]string{"svc.yaml": serviceYAML("web", 81)})
				return root
			},
			func(t *testing.T, root string, gen int) {
				configMapVolume(t, root, gen, map[string]string{"svc.yaml": serviceYAML("web", 80+gen)})
			}},
		{"a file of a ConfigMap volume",
			func(t *testing.T, root string) string {
				configMapVolume(t, root, 1, map[string]string{"svc.yaml": serviceYAML("web", 81)})
				return filepath.Join(root, "svc.yaml")
			},
			func(t *testing.T, root string, gen int) {
				configMapVolume(t, root, gen, map[string]string{"svc.yaml": serviceYAML("web", 80+gen)})
			}},
		{"a link to a file of a ConfigMap volume elsewhere",
			func(t *testing.T, root string) string {
				cm, etc := filepath.Join(root, "cm"), filepath.Join(root, "etc")
				os.Mkdir(cm, 0o755)
				os.Mkdir(etc, 0o755)
				configMapVolume(t, cm, 1, map[string]string{"svc.yaml": serviceYAML("web", 81)})
				if err := os.Symlink(filepath.Join(cm, "svc.yaml"), filepath.Join(etc, "svc.yaml")); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(etc, "svc.yaml")
			},
			func(t *testing.T, root string, gen int) {
				configMapVolume(t, filepath.Join(root, "cm"), gen, map[string]string{"svc.yaml": serviceYAML("web", 80+gen)})
			}},
		{"a directory of links into another directory",
			func(t *testing.T, root string) string {
				data, dir := filepath.Join(root, "data"), filepath.Join(root, "manifests")
				os.Mkdir(data, 0o755)
				os.Mkdir(dir, 0o755)
				writeFile(t, filepath.Join(data, "svc.yaml"), serviceYAML("web", 81))
				if err := os.Symlink(filepath.Join(data, "svc.yaml"), filepath.Join(dir, "svc.yaml")); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			func(t *testing.T, root string, gen int) {
				writeAtomic(t, filepath.Join(root, "data", "svc.yaml"), serviceYAML("web", 80+gen))
			}},
		{"the directory itself a link, re-pointed",
			func(t *testing.T, root string) string {
				v1 := filepath.Join(root, "v1")
				os.Mkdir(v1, 0o755)
				writeFile(t, filepath.Join(v1, "svc.yaml"), serviceYAML("web", 81))
				if err := os.Symlink(v1, filepath.Join(root, "current")); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(root, "current")
			},
			func(t *testing.T, root string, gen int) {
				if gen%2 == 0 { // a new directory behind the link
					v := filepath.Join(root, "v"+strconv.Itoa(gen))
					os.Mkdir(v, 0o755)
					writeFile(t, filepath.Join(v, "svc.yaml"), serviceYAML("web", 80+gen))
					repoint(t, filepath.Join(root, "current"), v)
					return
				}
				// an edit in place in the directory the link now names
				cur, err := filepath.EvalSymlinks(filepath.Join(root, "current"))
				if err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(cur, "svc.yaml"), serviceYAML("web", 80+gen))
			}},
		// Removed and made again (rm -rf out && helm template -o out): the
		// watch went with the directory, and only the poll saw it come
		// back (4-5 s with the binary's 5 s poll).
		{"the directory removed and made again",
			func(t *testing.T, root string) string {
				dir := filepath.Join(root, "out")
				os.Mkdir(dir, 0o755)
				writeFile(t, filepath.Join(dir, "svc.yaml"), serviceYAML("web", 81))
				return dir
			},
			func(t *testing.T, root string, gen int) {
				dir := filepath.Join(root, "out")
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				time.Sleep(300 * time.Millisecond) // the source has seen it gone
				os.Mkdir(dir, 0o755)
				writeFile(t, filepath.Join(dir, "svc.yaml"), serviceYAML("web", 80+gen))
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			path := tc.setup(t, root)
			rec, log := startSource(t, path, []string{"add Service default/web"}, WithPollInterval(time.Hour))
			for gen := 2; gen <= 4; gen++ {
				tc.update(t, root, gen)
				rec.waitFor(t, liveWait, "update Service default/web")
				if got, want := rec.serviceYAML("default/web").Spec.Ports[0].Port, int32(80+gen); got != want {
					t.Fatalf("generation %d: port %d, want %d", gen, got, want)
				}
			}
			// A directory that is gone is said (and its objects kept).
			if log.String() != "[]" && tc.name != "the directory removed and made again" {
				t.Errorf("unexpected errors: %s", log)
			}
		})
	}
}

// follow walked every ancestor of a path again from every ancestor that is
// a symlink: 2^k walks for k symlinked ancestors, per file, per reload (the
// tester's: 21 ms at k=8, 17 s at k=18; an idle proxy with 1,000 files at
// k=6 spent a third of a core). Each directory is now looked at once per
// call, and the answer is the same: every real directory on the way.
func TestWatchDirsNestedLinksOnce(t *testing.T) {
	const k = 10
	root := t.TempDir()
	realDir, link := root, root
	want := []string{root}
	for i := 1; i <= k; i++ {
		r := filepath.Join(realDir, "r"+strconv.Itoa(i))
		if err := os.Mkdir(r, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("r"+strconv.Itoa(i), filepath.Join(realDir, "l"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
		realDir, link = r, filepath.Join(link, "l"+strconv.Itoa(i))
		want = append(want, r)
	}
	var files []string
	for i := range 100 {
		f := filepath.Join(link, "f"+strconv.Itoa(i)+".yaml")
		writeFile(t, f, serviceYAML("x", 80))
		files = append(files, f)
	}
	start := time.Now()
	got := watchDirs(link, true, files)
	took := time.Since(start)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("watchDirs: %q\nwant %q", got, want)
	}
	if took > time.Second {
		t.Errorf("watchDirs took %v for %d files under %d symlinked ancestors", took, len(files), k)
	}
}

// fakeWatches is a watchList of names, as fsnotify keeps them.
type fakeWatches struct {
	names       map[string]bool
	added, gone int
}

func (f *fakeWatches) WatchList() []string { return slices.Collect(maps.Keys(f.names)) }
func (f *fakeWatches) Add(name string) error {
	f.names[name] = true
	f.added++
	return nil
}
func (f *fakeWatches) Remove(name string) error {
	delete(f.names, name)
	f.gone++
	return nil
}

// Every reload and poll hands the watcher every directory involved, which
// is one per file when the files are links into directories of their own
// (manifests/app.yaml -> /srv/app/service.yaml). Each directory watched was
// looked for in that list and each directory of the list in the watch
// list: among 20,000 such links an edit was taken after 15-34 s, most of it
// comparing paths. Now a set each way: the same watches, in linear time (at
// 40,000 a few to a hundred ms, where the searches took seconds).
func TestWatchExactlyManyDirectories(t *testing.T) {
	const n = 40_000
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = fmt.Sprintf("/srv/manifests/apps/app-%05d", i)
	}
	w := &fakeWatches{names: map[string]bool{"/srv/gone": true}}
	watchExactly(w, dirs)
	if w.added != n || w.gone != 1 || len(w.names) != n || !w.names[dirs[n-1]] {
		t.Fatalf("first update: %d added, %d removed, %d watched; want %d, 1, %d", w.added, w.gone, len(w.names), n, n)
	}
	// An idle poll: nothing to add or remove.
	start := time.Now()
	watchExactly(w, dirs)
	took := time.Since(start)
	if w.added != n || w.gone != 1 {
		t.Errorf("an update with nothing changed added %d and removed %d more", w.added-n, w.gone-1)
	}
	if took > 2*time.Second {
		t.Errorf("an update of %d watched directories with nothing changed took %v", n, took)
	}
	// One link re-pointed: its old directory goes, the new one comes.
	next := slices.Clone(dirs)
	next[7] = "/srv/manifests/apps/app-new"
	watchExactly(w, next)
	if w.added != n+1 || w.gone != 2 || w.names[dirs[7]] || !w.names[next[7]] {
		t.Errorf("re-pointed link: %d added, %d removed, old watched %v, new watched %v", w.added-n, w.gone-1, w.names[dirs[7]], w.names[next[7]])
	}
}
