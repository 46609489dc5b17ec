package config

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// A file gone (kept for its grace) and then the directory itself gone
// (renamed away, deleted): the re-check's listing fails, the kept file is
// never dropped, and the re-check is armed again at 0 each time.
func TestRecheckDoesNotSpinWhileTheDirectoryIsGone(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "m")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), serviceYAML("a", 80))
	writeFile(t, filepath.Join(dir, "b.yaml"), serviceYAML("b", 80))
	rec, log := newManifestRecorder(), &manifestErrors{}
	src := NewManifestSource(dir, rec, WithErrorReporter(log.report), WithPollInterval(time.Hour), WithSummaryReporter(func(string) {}))
	var lists atomic.Int64
	src.afterList = func() { lists.Add(1) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	defer func() { cancel(); <-done }()
	rec.waitFor(t, liveWait, "add Service default/a", "add Service default/b", "synced Service", "synced EndpointSlice")
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond) // the settle's reload: a.yaml kept for its grace
	if err := os.Rename(dir, filepath.Join(root, "m.old")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	before := lists.Load()
	time.Sleep(time.Second)
	n := lists.Load() - before
	t.Logf("listings in 1 s after the grace: %d; events %q; errors %s", n, rec.take(), log)
	if n > 5 {
		t.Errorf("%d listings in 1 s: the re-check spins", n)
	}
}
