package config

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/regularfile"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ManifestSource feeds a Handler from a manifest file or a directory of them
// (*.yaml, *.yml, *.json, not hidden), re-reading on change. It keeps, per
// file, the last good version of every object, so a bad edit never takes a
// Service away.
type ManifestSource struct {
	path    string
	h       Handler
	dec     decoder
	report  func(error)
	clock   clock.WithTicker
	poll    time.Duration
	settle  time.Duration
	watch   bool
	dirMode bool
	// target is the base name of the file a single-file path's link
	// names, as of the last listing ("" in directory mode): its events
	// are the file's (manifestEvent).
	target string

	files     map[string]*fileState
	served    map[objectKey]servedObject
	lastDups  map[string]bool
	lastReads map[string]string

	watcher    *dirWatcher // nil: polling only
	alloc      clusterIPAllocator
	summary    func(string)
	summarized bool            // the start-up summary was given
	lastShape  string          // files, skipped and erroneous files last summarized
	badFiles   map[string]bool // files whose last decode reported errors
	afterList  func()          // tests: runs between a reload's listing and its reads

	emptiedGrace time.Duration        // how long a file that reads empty keeps its objects
	emptied      map[string]time.Time // files kept so: since when they read empty

	vanishedGrace time.Duration        // how long a file that is gone keeps its objects
	vanished      map[string]time.Time // files kept so: since when they are gone
	// listFailed: the last listing failed (the directory gone): no kept
	// file can be looked at until it is back.
	listFailed bool
	// removedAt is when a manifest name last had a remove or rename event
	// (by base name: the watched directories are named by their real path,
	// which the listed names need not be), so that a file's grace counts
	// from when it went, not from the reload that found it gone, which a
	// stream of writes to other files holds back for up to ten settles.
	// Cleared by each reload: its listing is newer.
	removedAt map[string]time.Time
}

// Option configures a ManifestSource.
type Option func(*ManifestSource)

// WithErrorReporter sends every problem (invalid object, unreadable file,
// duplicate) to report instead of klog's error log (stderr).
func WithErrorReporter(report func(error)) Option {
	return func(s *ManifestSource) { s.report = report }
}

// WithPollInterval sets the fallback re-read interval (default 5 s).
func WithPollInterval(d time.Duration) Option { return func(s *ManifestSource) { s.poll = d } }

// WithDebounce sets how long the manifest files must have been quiet (no
// event on a manifest's name) before they are re-read, so that a burst of
// writes becomes one reload and a file being written is read once written
// (default 100 ms). A stream of writes postpones the reload to ten times
// this after the first event at most.
func WithDebounce(d time.Duration) Option { return func(s *ManifestSource) { s.settle = d } }

// WithClock replaces the real clock (poll ticker and debounce timer).
func WithClock(c clock.WithTicker) Option { return func(s *ManifestSource) { s.clock = c } }

// WithoutWatcher turns fsnotify off: changes are seen by polling only.
func WithoutWatcher() Option { return func(s *ManifestSource) { s.watch = false } }

// WithServiceClusterIPRange sets where a Service without clusterIP gets one
// (default DefaultServiceClusterIPRange); none makes such a Service an error.
func WithServiceClusterIPRange(ranges []netip.Prefix) Option {
	return func(s *ManifestSource) { s.alloc = newClusterIPAllocator(ranges) }
}

// WithSummaryReporter sends the summary lines (what was loaded at start and
// what each reload changed) and ClusterIP allocations to report instead of
// klog's info log.
func WithSummaryReporter(report func(string)) Option {
	return func(s *ManifestSource) { s.summary = report }
}

// WithNodePortRange sets the range spec.ports[].nodePort must fall in
// (default DefaultNodePortRange).
func WithNodePortRange(r PortRange) Option { return func(s *ManifestSource) { s.dec.nodePorts = r } }

// NewManifestSource watches path (a file or a directory) and delivers v1
// Services and discovery.k8s.io/v1 EndpointSlices to h; v1 Endpoints are
// converted to EndpointSlices. Nothing happens until Run.
func NewManifestSource(path string, h Handler, opts ...Option) *ManifestSource {
	s := &ManifestSource{
		path:    path,
		h:       h,
		dec:     decoder{nodePorts: DefaultNodePortRange},
		report:  func(err error) { klog.Error("manifests: ", err) },
		summary: func(msg string) { klog.Info("manifests: ", msg) },
		alloc:   newClusterIPAllocator(defaultServiceClusterIPRange),
		clock:   clock.RealClock{},
		poll:    5 * time.Second,
		settle:  100 * time.Millisecond,
		watch:   true,

		emptiedGrace: defaultEmptiedGrace,
		emptied:      map[string]time.Time{},

		vanishedGrace: defaultVanishedGrace,
		vanished:      map[string]time.Time{},
		removedAt:     map[string]time.Time{},

		files:     map[string]*fileState{},
		served:    map[objectKey]servedObject{},
		lastDups:  map[string]bool{},
		lastReads: map[string]string{},
		badFiles:  map[string]bool{},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Run loads everything, delivers Add events and then OnServiceSynced and
// OnEndpointSlicesSynced, and then applies changes as files are written,
// renamed into place, created or deleted. All handler calls come from the
// goroutine running Run. It returns an error at once only when path does not
// exist; otherwise it runs until ctx ends and returns ctx.Err().
func (s *ManifestSource) Run(ctx context.Context) error {
	info, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("manifests: %w", err)
	}
	s.dirMode = info.IsDir()

	// Watch before the first read (reload adds the directories before it
	// reads the files), so that no change falls between the two.
	w := s.startWatcher()
	defer w.close()
	s.watcher = w

	s.reload()
	s.h.OnServiceSynced()
	s.h.OnEndpointSlicesSynced()

	ticker := s.clock.NewTicker(s.poll)
	defer ticker.Stop()
	settle := newSettleWindow(s.clock, s.settle)
	defer settle.stop()
	// A file kept while it reads empty or is gone is read again when its
	// grace ends, whether or not anything else prompts a reload.
	recheck := &oneShot{clock: s.clock}
	defer recheck.stop()
	reload := func() {
		s.reload()
		recheck.stop()
		// With the listing failed (the directory gone) the kept files
		// wait for it to come back (its events, or the poll): re-checked
		// at once, over and over, the re-check spun (27,000 listings a
		// second).
		if d, ok := s.graceLeft(); ok && !s.listFailed {
			recheck.set(d)
		}
	}
	events, watchErrs := w.events(), w.errors()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-events:
			if !ok {
				events = nil // watcher gone; the poll carries on
				continue
			}
			s.noteEvent(settle, ev)
		case err, ok := <-watchErrs:
			if !ok {
				watchErrs = nil
				continue
			}
			s.report(fmt.Errorf("watching %s: %w", s.path, err))
		case <-settle.c:
			// Events already queued count: select picks among ready
			// channels at random.
		drain:
			for events != nil {
				select {
				case ev, ok := <-events:
					if !ok {
						events = nil
						break drain
					}
					s.noteEvent(settle, ev)
				default:
					break drain
				}
			}
			if settle.fired() {
				reload()
			}
		case <-recheck.c:
			recheck.stop()
			if !settle.isOpen() {
				reload()
				continue
			}
			// The files are being written: the gone ones whose grace
			// ended are dropped without reading any file (the settle's
			// reload reads them once written, and re-arms this for the
			// emptied ones). Left to the settle, a deleted file stayed up
			// to a capped settle more: 1.85 s beside a file rewritten
			// every 30 ms.
			s.dropGone()
			if d, ok := s.vanishedGraceLeft(); ok && !s.listFailed {
				recheck.set(d)
			}
		case <-ticker.C():
			if !settle.isOpen() { // files are being written: the settle's reload reads them once written
				reload()
			}
		}
	}
}

// noteEvent opens the settle window for an event and extends it for one
// on a manifest, whose removal or rename starts its grace.
func (s *ManifestSource) noteEvent(settle *settleWindow, ev fsnotify.Event) {
	if ev.Op == fsnotify.Chmod {
		return
	}
	now := s.clock.Now()
	settle.open(now)
	if base := filepath.Base(ev.Name); s.manifestEvent(base) {
		settle.manifestEvent(now)
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			s.removedAt[base] = now
		}
	}
}

// manifestEvent reports whether a file event on base is a manifest's,
// which postpones the reload until the files are quiet. A single file
// (PATH names one) may have any name: its events, or those of the file
// its link names, are; a directory's manifests are the entries it reads.
func (s *ManifestSource) manifestEvent(base string) bool {
	if !s.dirMode {
		return base == filepath.Base(s.path) || base == s.target
	}
	return notManifest(base) == ""
}

// reload re-reads every manifest file whose content changed, merges the
// files and delivers the difference to the handler.
func (s *ManifestSource) reload() { s.load(true) }

// dropGone removes the objects of the files kept by keepVanished that are
// still gone when their grace has ended, and reads no file: the files that
// are there may be being written.
func (s *ManifestSource) dropGone() { s.load(false) }

// load lists the manifest files, reads those whose content changed when
// read is set, merges the files and delivers the difference to the handler.
func (s *ManifestSource) load(read bool) {
	// The remove events are older than this listing, unless dropGone
	// defers to the settle's reload, which has yet to find those files
	// gone: their grace counts from the event.
	deferred := false
	defer func() {
		if !deferred {
			clear(s.removedAt)
		}
	}()
	// The path's own directories are watched before the listing: a file
	// made between the listing and the watch (the path just made again,
	// a first reload) was seen only by the next poll, 5 s later.
	s.watcher.add(watchDirs(s.path, s.dirMode, nil))
	names, unreadable, skipped, err := s.listFiles()
	if s.afterList != nil {
		s.afterList()
	}
	// Before reading: what a link now points at is watched from here on.
	s.watcher.update(watchDirs(s.path, s.dirMode, names))
	s.listFailed = err != nil
	if err != nil {
		s.reportRead(s.path, err)
		return // keep serving what we have
	}
	if s.dirMode {
		// A single file's listing and read share its name: its read
		// forgets an error that is over, and this forgot the read's error
		// each time, so every poll repeated it.
		s.forgetRead(s.path)
	}
	present := map[string]bool{}
	var recovered []string
	changed := false // a file's contribution changed: only then is the merge redone
	for _, name := range names {
		if !read {
			if _, known := s.files[name]; !known {
				if _, failed := s.lastReads[name]; failed {
					// Its read failed (a named pipe, a link loop, EIO):
					// it provides nothing until it is read, and waiting
					// for it kept every gone file while it stayed. It is
					// there all the same: its read error is kept (not
					// forgotten below, and reported again at the next
					// reload) and the summary counts and names it.
					present[name] = true
					continue
				}
				// A file not read yet may hold a gone file's objects (mv
				// a.yaml b.yaml, a git checkout's new file): dropping them
				// now deleted and re-added its Services at the settle's
				// reload, which reads it and drops what is still gone.
				deferred = true
				return
			}
			present[name] = true
			delete(s.vanished, name) // back: the next reload reads it
			continue
		}
		if err := unreadable[name]; err != nil {
			present[name] = true
			delete(s.vanished, name)
			s.reportRead(name, err)
			continue // keep the file's last good objects
		}
		data, err := readManifest(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed between listing and reading: gone
		}
		present[name] = true
		delete(s.vanished, name)
		if err != nil {
			s.reportRead(name, err)
			continue // keep the file's last good objects
		}
		s.forgetRead(name)
		prev := s.files[name]
		if prev != nil && prev.digest == digestOf(data) {
			delete(s.emptied, name)
			continue
		}
		if s.keepEmptied(name, data, prev) {
			continue
		}
		next, errs := s.dec.applyFile(name, data, prev)
		for _, e := range errs {
			s.report(e)
		}
		if len(errs) == 0 && s.badFiles[name] {
			recovered = append(recovered, name)
		}
		s.badFiles[name] = len(errs) > 0
		s.files[name] = next
		changed = true
	}
	for name := range s.lastReads {
		if !present[name] {
			delete(s.lastReads, name) // gone: its read error with it
		}
	}
	var provided map[objectKey]bool // by the files that are there, once one is gone
	for name, f := range s.files {
		if present[name] {
			continue
		}
		if provided == nil {
			provided = s.providedBy(func(name string) bool { return present[name] })
		}
		if !s.keepVanished(name, f, provided) {
			delete(s.files, name)
			delete(s.badFiles, name)
			delete(s.emptied, name)
			changed = true
		}
	}
	if !changed {
		// What is served is what these files gave: an idle poll at 10,000
		// Services spent 140-210 ms merging, allocating (a copy of every
		// Service without clusterIP) and comparing them to find nothing.
		s.summarize(len(present), skipped, nil, nil)
		return
	}

	desired, problems := resolve(s.withoutShadowed())
	allocated, placeErrs := s.alloc.place(desired, s.served)
	s.reportOnce(slices.Concat(problems, placeErrs))
	for _, a := range allocated {
		s.summary(a.String())
	}
	events := diff(s.served, desired)
	beginBatch(s.h)
	for _, e := range events {
		deliver(s.h, e)
	}
	endBatch(s.h)
	s.served = desired
	s.summarize(len(present), skipped, events, recovered)
}

// readManifest reads a manifest file through regularfile.Read: a FIFO
// renamed over it after the listing, or a file over the cap, is an error of
// that file, not a read that blocks the source or exhausts memory.
func readManifest(name string) ([]byte, error) {
	data, err := regularfile.Read(name, maxManifestFileSize, nil)
	var tooLarge *regularfile.TooLargeError
	if errors.As(err, &tooLarge) {
		err = fmt.Errorf("%w, the most a manifest file may hold: split it into several files in a directory", err)
	}
	return data, err
}

// defaultEmptiedGrace is how long a file that held objects and reads as
// holding none keeps them: longer than a generator writing through a shell
// redirection usually runs (helm template, kustomize build: well under a
// second from local files, seconds when they fetch a remote chart or base),
// and no longer than the fallback poll, so that a file emptied on purpose
// still serves nothing within seconds.
const defaultEmptiedGrace = 5 * time.Second

// keepEmptied says whether a file that held objects and now reads as holding
// none (empty, or only blanks and comments) keeps them. A file is rewritten
// in place (kustomize build > all.yaml) by truncating it and writing it again
// when the generator is done; read meanwhile, as an edit, it deleted every
// Service of the file (closing its proxy sockets, losing its affinity) and
// added them again, on other proxy ports, a moment later. A file is deleted
// to remove its objects: one that still reads empty when emptiedGrace has
// passed is taken as it is.
func (s *ManifestSource) keepEmptied(name string, data []byte, prev *fileState) bool {
	if prev == nil || len(prev.objects) == 0 || !blank(data) {
		delete(s.emptied, name)
		return false
	}
	now := s.clock.Now()
	since, kept := s.emptied[name]
	if !kept {
		since = now
		s.emptied[name] = since
		s.summary(fmt.Sprintf("%s holds no objects: keeping its last %d for %v, as it may be being written in place "+
			"(write it to a temporary file in the same directory and rename it into place)", name, len(prev.objects), s.emptiedGrace))
	}
	if now.Sub(since) < s.emptiedGrace {
		return true
	}
	delete(s.emptied, name)
	return false
}

// defaultVanishedGrace is how long a file that held objects and is gone
// keeps them: far longer than tools that save by writing a new file leave
// it missing (vim and emacs rename it to a backup and create it again at
// once; git checkout unlinks each changed file and creates it again: a
// few milliseconds), and short enough that a file deleted on purpose still
// takes its objects with it within the source's 1 s. It counts from the
// file's remove or rename event when one was seen (else from the reload
// that found it gone), so a reload held back by a stream of writes to
// other files does not add to it.
const defaultVanishedGrace = 500 * time.Millisecond

// keepVanished says whether a file that held objects and is gone keeps
// them. Deleted at once, a git checkout's or vim's save deleted every
// Service of the file (closing its proxy sockets, losing its affinity) and
// added them again, on other proxy ports, a moment later. A file whose
// objects the files that are there all provide (it was renamed) is not
// kept: there is nothing to wait for.
func (s *ManifestSource) keepVanished(name string, f *fileState, provided map[objectKey]bool) bool {
	if !slices.ContainsFunc(f.objects, func(o servedObject) bool { return !provided[o.key] }) {
		delete(s.vanished, name)
		return false
	}
	now := s.clock.Now()
	since, kept := s.vanished[name]
	if !kept {
		since = now
		if removed, ok := s.removedAt[filepath.Base(name)]; ok && removed.Before(now) {
			since = removed
		}
		s.vanished[name] = since
		klog.V(2).InfoS("Manifest file gone: keeping its objects for a grace, as it may be being saved anew", "file", name, "grace", s.vanishedGrace)
	}
	if now.Sub(since) < s.vanishedGrace {
		return true
	}
	delete(s.vanished, name)
	return false
}

// withoutShadowed is the files' contributions as served: a gone file kept
// by keepVanished gives only the objects no file that is there provides, so
// that a file renamed (mv a.yaml b.yaml, a git checkout moving it) hands
// them on at once rather than making each a duplicate for the grace.
func (s *ManifestSource) withoutShadowed() map[string]*fileState {
	if len(s.vanished) == 0 {
		return s.files
	}
	provided := s.providedBy(func(name string) bool { _, gone := s.vanished[name]; return !gone })
	files := maps.Clone(s.files)
	for name := range s.vanished {
		f := s.files[name]
		if f == nil {
			continue
		}
		kept := &fileState{}
		for _, o := range f.objects {
			if !provided[o.key] {
				kept.objects = append(kept.objects, o)
			}
		}
		files[name] = kept
	}
	return files
}

// providedBy is the keys of the objects of the files that there says are there.
func (s *ManifestSource) providedBy(there func(name string) bool) map[objectKey]bool {
	provided := map[objectKey]bool{}
	for name, f := range s.files {
		if there(name) {
			for _, o := range f.objects {
				provided[o.key] = true
			}
		}
	}
	return provided
}

// vanishedGraceLeft is how long until the first file kept by keepVanished
// is to be looked for again; false when none is kept.
func (s *ManifestSource) vanishedGraceLeft() (time.Duration, bool) {
	return s.firstGraceLeft(s.vanished, s.vanishedGrace)
}

// firstGraceLeft is how long until the grace of the first file of kept
// (since when each is kept) ends, at least minRecheck; false when kept
// is empty.
func (s *ManifestSource) firstGraceLeft(kept map[string]time.Time, grace time.Duration) (time.Duration, bool) {
	if len(kept) == 0 {
		return 0, false
	}
	first := slices.MinFunc(slices.Collect(maps.Values(kept)), time.Time.Compare)
	return max(minRecheck, first.Add(grace).Sub(s.clock.Now())), true
}

// minRecheck is the soonest a kept file is looked at again: a grace can be
// over with the file still kept, when dropGone left the drop to the
// settle's reload, and re-armed at 0 the re-check would spin until then.
const minRecheck = 50 * time.Millisecond

// graceLeft is how long until a file kept by either grace is to be read
// again; false when none is kept.
func (s *ManifestSource) graceLeft() (time.Duration, bool) {
	e, eok := s.emptiedGraceLeft()
	v, vok := s.vanishedGraceLeft()
	switch {
	case eok && vok:
		return min(e, v), true
	case eok:
		return e, true
	}
	return v, vok
}

// emptiedGraceLeft is how long until the first file kept by keepEmptied is
// to be read again; false when none is kept.
func (s *ManifestSource) emptiedGraceLeft() (time.Duration, bool) {
	return s.firstGraceLeft(s.emptied, s.emptiedGrace)
}

// skippedFile is a directory entry that is not read, and why.
type skippedFile struct {
	name, why string
}

// listFiles names the manifest files: the file itself, or the directory's
// non-hidden *.yaml, *.yml and *.json entries (symlinks followed, no
// recursion: a subdirectory is skipped as one), and the entries it skips. A single file that is gone is an
// error, as a directory that is gone: the path keeps its last good objects
// until it returns (emptied, it serves nothing). Listed as nothing, every
// Service it held was dropped, and came back on new proxy ports.
//
// Only a file that does not exist (a link to nothing included) is gone. A
// listed file that cannot be read as a manifest (a named pipe or a device
// renamed or linked over it, a stat that fails otherwise: a link loop,
// EACCES, EIO) is named, with why, in unreadable: it is an error of that
// file, which keeps its last good objects, and is not opened. Skipped as
// "not a regular file", it was taken as gone and its Services were
// deleted (one NFS hiccup dropped them), with nothing at error level.
func (s *ManifestSource) listFiles() (names []string, unreadable map[string]error, skipped []skippedFile, err error) {
	if !s.dirMode {
		if _, err := os.Stat(s.path); err != nil {
			return nil, nil, nil, err
		}
		if real, err := filepath.EvalSymlinks(s.path); err == nil {
			s.target = filepath.Base(real)
		}
		return []string{s.path}, nil, nil, nil
	}
	entries, err := os.ReadDir(s.path)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, e := range entries {
		full := filepath.Join(s.path, e.Name())
		why := notManifest(e.Name())
		if why == "" || (why != hiddenEntry && mayBeDir(e)) {
			// A subdirectory is said to be one whatever its name: "not
			// .yaml" left the reader wondering about the name.
			info, err := os.Stat(full)
			var cannot error
			switch {
			case err == nil && info.IsDir():
				why = "a directory, not read"
			case why != "":
			case errors.Is(err, fs.ErrNotExist) && e.Type()&fs.ModeSymlink != 0:
				why = "a link to nothing" // gone, as the file it named
			case errors.Is(err, fs.ErrNotExist):
				continue // removed since the directory was read
			case err != nil:
				cannot = err // a link loop, EACCES on the way, EIO: not gone
			case !info.Mode().IsRegular():
				cannot = &regularfile.NotRegularError{Mode: info.Mode()}
			}
			if cannot != nil {
				if unreadable == nil {
					unreadable = map[string]error{}
				}
				unreadable[full] = cannot
			}
		}
		if why != "" {
			skipped = append(skipped, skippedFile{e.Name(), why})
			continue
		}
		names = append(names, full)
	}
	slices.Sort(names)
	return names, unreadable, skipped, nil
}

// hiddenEntry is why a name starting with a dot is not read.
const hiddenEntry = "hidden"

// mayBeDir says whether a directory entry is a directory or a link that
// may point at one, without a system call.
func mayBeDir(e fs.DirEntry) bool { return e.IsDir() || e.Type()&fs.ModeSymlink != 0 }

// notManifest says why a directory entry is not read by its name, or ""
// when its name is a manifest's.
func notManifest(name string) string {
	if strings.HasPrefix(name, ".") {
		return hiddenEntry // editor swap files, ConfigMap volume internals (..data)
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return ""
	}
	return "not .yaml, .yml or .json"
}

// reportRead reports a read failure once until it changes or goes away, so
// the poll does not repeat it every few seconds.
func (s *ManifestSource) reportRead(name string, err error) {
	if s.lastReads[name] == err.Error() {
		return
	}
	s.lastReads[name] = err.Error()
	s.report(fmt.Errorf("%s: %w (keeping its last good objects)", name, err))
}

func (s *ManifestSource) forgetRead(name string) { delete(s.lastReads, name) }

// reportOnce reports each problem of the merged state (a duplicate, a
// Service that got no ClusterIP) once, not on every reload.
func (s *ManifestSource) reportOnce(errs []error) {
	now := map[string]bool{}
	for _, e := range errs {
		now[e.Error()] = true
		if !s.lastDups[e.Error()] {
			s.report(e)
		}
	}
	s.lastDups = now
}

// maxManifestFileSize is the most a manifest file may hold: twenty times
// what 10,000 Services and their slices weigh in one file (3 MiB). A larger
// one is an error of the file, not an allocation of its size (a sparse
// 1 TiB file killed the proxy). It bounds what is read, not what a file
// decodes into: the YAML decoder holds about 100 bytes per node, and a
// node can be two bytes (`1,`), so a crafted 8 MiB document took 854 MB
// and a 64 MiB one more than 4 GB (sweep 10). That is bounded per document
// by maxDocumentValues, counted before decoding, which a `kubectl get -o
// yaml` List of a large cluster (one document of tens of MB) passes.
const maxManifestFileSize = 64 << 20
