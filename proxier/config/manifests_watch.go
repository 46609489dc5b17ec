package config

import (
	"crypto/sha256"
	"path/filepath"

	"github.com/fsnotify/fsnotify"
)

// dirWatcher wraps fsnotify on the directory that holds the manifests (the
// directory itself, or a single file's parent: watching the parent is what
// sees a file renamed into place or re-created). A nil *dirWatcher is valid
// and never fires, which is the poll-only mode.
type dirWatcher struct {
	dir   string
	w     *fsnotify.Watcher
	added bool
}

func (s *ManifestSource) startWatcher() *dirWatcher {
	if !s.watch {
		return nil
	}
	dir := s.path
	if !s.dirMode {
		dir = filepath.Dir(s.path)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		s.report(err)
		return nil // polling still sees every change, only later
	}
	dw := &dirWatcher{dir: dir, w: w}
	dw.ensure()
	return dw
}

// ensure (re-)adds the watch, e.g. after the directory was removed and
// created again.
func (d *dirWatcher) ensure() {
	if d == nil {
		return
	}
	if d.added && len(d.w.WatchList()) > 0 {
		return
	}
	d.added = d.w.Add(d.dir) == nil
}

// events yields the directory's events. Any event but a chmod counts, since
// the manifests may be symlinks whose targets change (a ConfigMap volume
// swaps its ..data link); reload compares content and ignores the rest.
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
