package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	testclock "k8s.io/utils/clock/testing"
)

// A manifest name that cannot be read (a named pipe, a link loop: an error
// of that file, reported once) is no file "not read yet" that may provide a
// gone file's objects: while one is listed, dropGone never dropped anything,
// so beside a stream of writes a deleted file's Services stayed until the
// settle's reload, and the early return forgot the remove events, so a file
// removed just before that dropGone started its grace only at the reload.
func TestDropGoneBesideAnUnreadableFile(t *testing.T) {
	dir := t.TempDir()
	gone, busy := filepath.Join(dir, "gone.yaml"), filepath.Join(dir, "busy.yaml")
	writeFile(t, gone, serviceYAML("gone", 80))
	writeFile(t, busy, serviceYAML("busy", 80))
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	clk := testclock.NewFakeClock(time.Now())
	src, rec, log := manualSource(dir, WithClock(clk))
	src.reload()
	rec.take()
	if !strings.Contains(log.String(), "pipe.yaml") {
		t.Fatalf("the named pipe was not reported: %s", log)
	}

	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	src.removedAt["gone.yaml"] = clk.Now() // as Run notes the event
	clk.Step(100 * time.Millisecond)
	src.reload() // finds it gone: kept
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("events within the grace: %q", got)
	}
	writeFile(t, busy, serviceYAML("busy", 81)) // being written: not to be read yet
	clk.Step(defaultVanishedGrace)
	src.dropGone() // the re-check, fired while the settle is pending
	if got, want := rec.take(), []string{"delete Service default/gone"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events when the grace ended: %q, want %q", got, want)
	}
}

// dropGone returns early while a file it has not read is listed (it may
// provide a gone file's objects), but that return must not forget the
// remove events of files the next reload has yet to find gone: their grace
// then counted from that reload, up to a capped settle late.
func TestDropGoneKeepsRemoveEventsWhenItDefers(t *testing.T) {
	dir := t.TempDir()
	first, second, busy := filepath.Join(dir, "first.yaml"), filepath.Join(dir, "second.yaml"), filepath.Join(dir, "busy.yaml")
	writeFile(t, first, serviceYAML("first", 80))
	writeFile(t, second, serviceYAML("second", 80))
	writeFile(t, busy, serviceYAML("busy", 80))
	clk := testclock.NewFakeClock(time.Now())
	src, rec, log := manualSource(dir, WithClock(clk))
	src.reload()
	rec.take()

	// first.yaml goes and is found gone: a re-check is armed.
	if err := os.Remove(first); err != nil {
		t.Fatal(err)
	}
	src.removedAt["first.yaml"] = clk.Now()
	src.reload()
	// second.yaml goes, and a new file is written before the re-check.
	clk.Step(100 * time.Millisecond)
	if err := os.Remove(second); err != nil {
		t.Fatal(err)
	}
	removed := clk.Now()
	src.removedAt["second.yaml"] = removed
	writeFile(t, filepath.Join(dir, "new.yaml"), serviceYAML("new", 80))
	clk.Step(50 * time.Millisecond)
	src.dropGone() // defers: new.yaml is not read yet
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("events while deferring: %q", got)
	}
	clk.Step(300 * time.Millisecond)
	src.reload() // the settle's reload finds second.yaml gone
	if since, ok := src.vanished[second]; !ok || !since.Equal(removed) {
		t.Errorf("second.yaml's grace counts from %v (kept %v), want its remove event %v", since, ok, removed)
	}
	if log.String() != "[]" {
		t.Errorf("unexpected errors: %s", log)
	}
}

// dropGone skips a listed file whose read failed, but it must not forget
// that read's error (the file is still there): forgotten, the next reload
// reported the same error again (it is reported once), and the summary
// in between left the file out.
func TestDropGoneKeepsAnUnreadableFilesError(t *testing.T) {
	dir := t.TempDir()
	one, busy := filepath.Join(dir, "one.yaml"), filepath.Join(dir, "busy.yaml")
	writeFile(t, one, serviceYAML("one", 80))
	writeFile(t, busy, serviceYAML("busy", 80))
	pipe := filepath.Join(dir, "pipe.yaml")
	if err := syscall.Mkfifo(pipe, 0o644); err != nil {
		t.Fatal(err)
	}
	var summaries []string
	clk := testclock.NewFakeClock(time.Now())
	src, rec, log := manualSource(dir, WithClock(clk),
		WithSummaryReporter(func(s string) { summaries = append(summaries, s) }))
	src.reload()
	rec.take()
	pipeErrors := func() int {
		log.mu.Lock()
		defer log.mu.Unlock()
		n := 0
		for _, m := range log.msgs {
			if strings.Contains(m, "pipe.yaml") {
				n++
			}
		}
		return n
	}
	if pipeErrors() != 1 {
		t.Fatalf("the named pipe was not reported once: %s", log)
	}

	// one.yaml goes; its grace ends while busy.yaml is being written.
	if err := os.Remove(one); err != nil {
		t.Fatal(err)
	}
	src.removedAt["one.yaml"] = clk.Now()
	src.reload()
	writeFile(t, busy, serviceYAML("busy", 81))
	clk.Step(defaultVanishedGrace)
	summaries = nil
	src.dropGone()
	if got, want := rec.take(), []string{"delete Service default/one"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events when one.yaml's grace ended: %q, want %q", got, want)
	}
	if _, ok := src.lastReads[pipe]; !ok {
		t.Errorf("after a dropGone the unreadable pipe.yaml's read error is forgotten: lastReads %q", src.lastReads)
	}
	for _, s := range summaries {
		if !strings.Contains(s, "pipe.yaml") {
			t.Errorf("summary after the dropGone does not name the unreadable pipe.yaml: %q", s)
		}
	}
	src.reload()
	if n := pipeErrors(); n != 1 {
		t.Errorf("the unchanged pipe.yaml error was reported %d times, want once: %s", n, log)
	}
}
