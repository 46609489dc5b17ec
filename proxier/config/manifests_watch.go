package config

import (
	"crypto/sha256"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/fsnotify/fsnotify"
)

// dirWatcher wraps fsnotify on the directories whose events can change what
// the manifests read (see watchDirs). A nil *dirWatcher is valid and never
// fires, which is the poll-only mode.
type dirWatcher struct {
	w *fsnotify.Watcher
}

func (s *ManifestSource) startWatcher() *dirWatcher {
	if !s.watch {
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		s.report(err)
		return nil // polling still sees every change, only later
	}
	return &dirWatcher{w: w}
}

// update watches exactly dirs: it adds the new ones (and one removed and
// created again, which inotify dropped) and removes the ones no longer
// involved, such as the old target of a re-pointed link. A directory that
// cannot be added is tried again at the next update.
func (d *dirWatcher) update(dirs []string) {
	if d == nil {
		return
	}
	watchExactly(d.w, dirs)
}

// add watches dirs too, removing none.
func (d *dirWatcher) add(dirs []string) {
	if d == nil {
		return
	}
	watchAlso(d.w, d.w.WatchList(), dirs)
}

// watchList is the part of fsnotify's Watcher that update and add use.
type watchList interface {
	WatchList() []string
	Add(name string) error
	Remove(name string) error
}

// watchExactly makes w watch exactly dirs. Each list is looked up in a set
// of the other: every reload and poll hands over every directory involved,
// one per file when the files are links into directories of their own, and
// a search of one list for each entry of the other was quadratic: among
// 20,000 such links an edit was taken after 15-34 s on a busy node (4.6-6.3
// CPU-seconds), and every 5 s poll spent seconds comparing paths.
func watchExactly(w watchList, dirs []string) {
	want := make(map[string]bool, len(dirs))
	for _, dir := range dirs {
		want[dir] = true
	}
	have := w.WatchList()
	for _, dir := range have {
		if !want[dir] {
			_ = w.Remove(dir)
		}
	}
	watchAlso(w, have, dirs)
}

// watchAlso adds to w each of dirs that is not in have, what w watches.
func watchAlso(w watchList, have, dirs []string) {
	watched := make(map[string]bool, len(have))
	for _, dir := range have {
		watched[dir] = true
	}
	for _, dir := range dirs {
		if !watched[dir] {
			_ = w.Add(dir)
		}
	}
}

// watchDirs lists the directories to watch for path (a manifests directory
// when isDir, else a file) and the manifest files in it: the directory
// holding each file (a file renamed into place or re-created is an event
// there), the directory itself, and the directory holding every symlink met
// on the way to them. inotify follows a link when a watch is added, so
// re-pointing a link (kubelet swapping a ConfigMap volume's ..data, a
// directory link moved to a new release) is an event only where the link
// is, and later changes happen in the new target, which must be watched
// from then on. Directories are named by their real path, so one directory
// reached two ways is watched once.
func watchDirs(path string, isDir bool, files []string) []string {
	set := map[string]bool{}
	added := map[string]bool{}
	w := &linkWalker{
		add: func(dir string) {
			if added[dir] {
				return
			}
			added[dir] = true
			if real, err := filepath.EvalSymlinks(dir); err == nil {
				set[real] = true
			}
		},
		followed: map[followKey]bool{},
		walked:   map[string]bool{},
	}
	w.follow(path, isDir, 0)
	for _, f := range files {
		w.follow(f, false, 0)
	}
	// A path that is gone (a directory removed to be generated again,
	// rm -rf out && helm template -o out) is watched for from the nearest
	// directory that is there: the watch on it went with it, and only the
	// poll saw it come back (4-5 s, not within 1 s).
	if _, err := os.Stat(path); err != nil {
		for a := filepath.Dir(filepath.Clean(path)); ; a = filepath.Dir(a) {
			if info, err := os.Stat(a); err == nil && info.IsDir() {
				w.add(a)
				break
			}
			if a == filepath.Dir(a) {
				break
			}
		}
	}
	return slices.Sorted(func(yield func(string) bool) {
		for d := range set {
			if !yield(d) {
				return
			}
		}
	})
}

// maxLinks bounds a chain of symlinks, as the kernel's ELOOP does.
const maxLinks = 40

// linkWalker is one watchDirs call's walk: each path is followed, and each
// directory's ancestors walked, once. Without that, every symlinked
// ancestor walked all the ancestors again: 2^k walks for k of them, per
// file and per reload (17 s for one file at k=18).
type linkWalker struct {
	add      func(dir string)
	followed map[followKey]bool
	walked   map[string]bool // directories whose ancestors, themselves included, were followed
}

type followKey struct {
	path  string
	isDir bool
}

// follow adds the directories p depends on: the directory holding p (or p
// itself when it is a directory), and for p and each of its parent
// directories that is a symlink, the directory holding the link and what
// the link names.
func (w *linkWalker) follow(p string, isDir bool, depth int) {
	p = filepath.Clean(p)
	if depth > maxLinks || w.followed[followKey{p, isDir}] {
		return
	}
	w.followed[followKey{p, isDir}] = true
	for a := filepath.Dir(p); a != filepath.Dir(a) && !w.walked[a]; a = filepath.Dir(a) {
		w.walked[a] = true // its own ancestors are next in this loop
		if isSymlink(a) {
			w.follow(a, true, depth+1)
		}
	}
	if !isSymlink(p) {
		if isDir {
			w.add(p)
		} else {
			w.add(filepath.Dir(p))
		}
		return
	}
	w.add(filepath.Dir(p))
	target, err := os.Readlink(p)
	if err != nil {
		return
	}
	if !filepath.IsAbs(target) {
		// Relative to the directory the link is really in: ".." in the
		// target is taken there, as the kernel does.
		base, err := filepath.EvalSymlinks(filepath.Dir(p))
		if err != nil {
			base = filepath.Dir(p)
		}
		target = filepath.Join(base, target)
	}
	w.follow(target, isDir, depth+1)
}

func isSymlink(p string) bool {
	info, err := os.Lstat(p)
	return err == nil && info.Mode()&fs.ModeSymlink != 0
}

// events yields the watched directories' events. Any event but a chmod
// counts; reload compares content and ignores the rest.
func (d *dirWatcher) events() <-chan fsnotify.Event {
	if d == nil {
		return nil
	}
	return d.w.Events
}

func (d *dirWatcher) errors() <-chan error {
	if d == nil {
		return nil
	}
	return d.w.Errors
}

func (d *dirWatcher) close() {
	if d != nil {
		d.w.Close()
	}
}

func digestOf(data []byte) [sha256.Size]byte { return sha256.Sum256(data) }
