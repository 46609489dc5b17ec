package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// reloadWithin runs one reload and fails the test if it does not return in
// time (a reload blocked on a file leaks its goroutine: the test is over).
func reloadWithin(t *testing.T, src *ManifestSource, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		src.reload()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("reload still blocked after %v", d)
	}
}

// A FIFO renamed over a manifest between the listing (a regular file then)
// and the read blocked the read for good: os.ReadFile opened it and waited
// for a writer, and the source applied nothing from then on. The read now
// opens without blocking and refuses what the open descriptor shows is not
// a regular file, as an error of that file.
func TestManifestSwappedForFIFOAfterListing(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "x.yaml")
	writeFile(t, name, serviceYAML("x", 80))
	src, rec, log := manualSource(dir)
	src.reload()
	if got := rec.take(); len(got) != 1 || got[0] != "add Service default/x" {
		t.Fatalf("first reload: %q", got)
	}

	writeFile(t, name, serviceYAML("x", 81)) // changed: read again
	src.afterList = func() {
		fifo := filepath.Join(dir, ".fifo")
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Error(err)
			return
		}
		if err := os.Rename(fifo, name); err != nil {
			t.Error(err)
		}
	}
	reloadWithin(t, src, 2*time.Second)
	if got := rec.take(); len(got) != 0 {
		t.Errorf("events: %q, want none (the file keeps its last good objects)", got)
	}
	if !log.contains("x.yaml: not a regular file") {
		t.Errorf("errors: %s, want x.yaml named as not a regular file", log)
	}
}

// A 1 TiB sparse file (no blocks on disk) in the directory killed the
// proxy: os.ReadFile allocates the size stat gives, "fatal error: runtime:
// out of memory". A file over the cap is an error of that file, naming the
// cap; the file keeps its last good objects, as for any unreadable file.
func TestManifestOverSizeCap(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "zz.yaml")
	writeFile(t, name, serviceYAML("zz", 80))
	src, rec, log := manualSource(dir)
	src.reload()
	rec.take()

	if err := os.Truncate(name, 1<<40); err != nil {
		t.Skip("no sparse 1 TiB file here:", err)
	}
	reloadWithin(t, src, 5*time.Second)
	if got := rec.take(); len(got) != 0 {
		t.Errorf("events: %q, want none (the file keeps its last good objects)", got)
	}
	if !log.contains("zz.yaml: larger than 64 MiB") {
		t.Errorf("errors: %s, want zz.yaml named as over the 64 MiB cap", log)
	}
}

// The cap is well above what 10,000 Services and their slices weigh in one
// file (the scale benchmarks' objects: about 3 MiB).
func TestManifestSizeCapHolds10kServices(t *testing.T) {
	dir := t.TempDir()
	writeServices(t, dir, 10000, 1, true)
	info, err := os.Stat(filepath.Join(dir, "f000.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("10,000 Services and their slices in one file: %d bytes", info.Size())
	if info.Size()*10 > maxManifestFileSize {
		t.Errorf("10,000 Services weigh %d bytes: the cap (%d) is not ten times that", info.Size(), maxManifestFileSize)
	}
	if testing.Short() {
		return
	}
	rec := newManifestRecorder()
	newIdleSource(t, dir, rec)
	if n := strings.Count(strings.Join(rec.take(), "\n"), "add Service"); n != 10000 {
		t.Errorf("%d Services added, want 10000", n)
	}
}

// A named pipe or a device put over a manifest before the listing (mkfifo
// .f && mv .f x.yaml; ln -sfn /dev/zero .l && mv -T .l x.yaml) was listed
// as skipped, "not a regular file", at info level only, and its file's
// Services were deleted as if it were gone. It is an error naming the file
// and what it is, reported once, and the file keeps its last good objects,
// as one that turns into a pipe after the listing does; it is not opened.
func TestManifestReplacedByNonRegularFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replace func(t *testing.T, tmp string)
		want    string
	}{
		{"named pipe renamed over it", func(t *testing.T, tmp string) {
			if err := syscall.Mkfifo(tmp, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "x.yaml: not a regular file (a named pipe)"},
		{"link to a device renamed over it", func(t *testing.T, tmp string) {
			if err := os.Symlink("/dev/zero", tmp); err != nil {
				t.Fatal(err)
			}
		}, "x.yaml: not a regular file (a character device)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			name := filepath.Join(dir, "x.yaml")
			writeFile(t, name, serviceYAML("x", 80))
			src, rec, log := manualSource(dir)
			src.reload()
			if got := rec.take(); len(got) != 1 || got[0] != "add Service default/x" {
				t.Fatalf("first reload: %q", got)
			}

			tmp := filepath.Join(dir, ".tmp")
			tc.replace(t, tmp)
			if err := os.Rename(tmp, name); err != nil {
				t.Fatal(err)
			}
			for range 2 { // the poll's next reload does not repeat the error
				reloadWithin(t, src, 2*time.Second)
			}
			if got := rec.take(); len(got) != 0 {
				t.Errorf("events: %q, want none (the file keeps its last good objects)", got)
			}
			if got := log.String(); strings.Count(got, tc.want) != 1 || strings.Count(got, "x.yaml") != 1 {
				t.Errorf("errors: %s, want %q once", got, tc.want)
			}
		})
	}
}

// A listed manifest whose stat fails for another reason than "does not
// exist" (a link loop: ELOOP; a directory on the way made unreadable:
// EACCES; an NFS hiccup: EIO) was skipped as "not a regular file" and its
// Services deleted, at info level only. Only a file that is not there (a
// link whose target is gone included) is gone; any other failure is an
// error naming the file and why, reported once, and the file keeps its
// last good objects.
func TestManifestStatFailureKeepsLastGood(t *testing.T) {
	for _, tc := range []struct {
		name, target string // x.yaml becomes a link to target
		wantErr      string
		wantEvents   []string
		wantSkipped  string
	}{
		{"link loop", "x.yaml", "x.yaml: stat " + "DIR" + "/x.yaml: too many levels of symbolic links", nil, ""},
		{"link to nothing", "gone.yaml", "", []string{"delete Service default/x"}, "x.yaml (a link to nothing)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			name := filepath.Join(dir, "x.yaml")
			writeFile(t, name, serviceYAML("x", 80))
			rec, log, sums := newManifestRecorder(), &manifestErrors{}, &summaries{}
			src := NewManifestSource(dir, rec, WithoutWatcher(), WithErrorReporter(log.report), WithSummaryReporter(sums.report),
				withVanishedGrace(0))
			src.dirMode = true
			src.reload()
			rec.take()

			tmp := filepath.Join(dir, ".tmp")
			if err := os.Symlink(tc.target, tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, name); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				reloadWithin(t, src, 2*time.Second)
			}
			if got := rec.take(); strings.Join(got, "\n") != strings.Join(tc.wantEvents, "\n") {
				t.Errorf("events: %q, want %q", got, tc.wantEvents)
			}
			want := strings.ReplaceAll(tc.wantErr, "DIR", dir)
			got := log.String()
			if want == "" && got != "[]" || want != "" && (strings.Count(got, want) != 1 || strings.Count(got, "keeping") != 1) {
				t.Errorf("errors: %s, want %q once", got, want)
			}
			last := sums.all()[len(sums.all())-1]
			skips := strings.Contains(last, "skipped ")
			if tc.wantSkipped == "" && skips || tc.wantSkipped != "" && !strings.Contains(last, "skipped "+tc.wantSkipped) {
				t.Errorf("summary %q, want skipped %q", last, tc.wantSkipped)
			}
		})
	}
}

// In single-file mode a read error was reported again at every reload
// (every 5 s poll, every event in the file's directory): the listing's
// success cleared the suppression under the same name, the path's. It is
// reported once until it changes or the file reads again, as in a directory.
func TestSingleFileReadErrorReportedOnce(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "x.yaml")
	writeFile(t, name, serviceYAML("x", 80))
	src, rec, log := manualSource(name)
	src.reload()
	rec.take()

	pipe := func() {
		tmp := filepath.Join(dir, ".fifo")
		if err := syscall.Mkfifo(tmp, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, name); err != nil {
			t.Fatal(err)
		}
	}
	pipe()
	for range 3 {
		reloadWithin(t, src, 2*time.Second)
	}
	if n := strings.Count(log.String(), "not a regular file"); n != 1 {
		t.Errorf("%d errors for 3 reloads of one unreadable file, want 1: %s", n, log)
	}
	writeAtomic(t, name, serviceYAML("x", 80))
	reloadWithin(t, src, 2*time.Second)
	pipe()
	reloadWithin(t, src, 2*time.Second)
	if n := strings.Count(log.String(), "not a regular file"); n != 2 {
		t.Errorf("%d errors after it read again and became unreadable again, want 2: %s", n, log)
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("events: %q, want none", got)
	}
}
