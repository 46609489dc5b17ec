package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A single manifest file (--manifests PATH naming a file) may have any
// name: its own events are what the reload waits out, as a manifest's in a
// directory. Only names ending .yaml, .yml or .json that are not hidden
// counted, so a file named "services" saved by vim (renamed to a backup, a
// new one written in pieces) was read 0.1 s after the first event, half
// written: the Services it did not hold yet were deleted and added again.
func TestSingleFileOfAnyNameIsReadOnceWritten(t *testing.T) {
	for _, base := range []string{"all.yaml", "services", "cluster.conf", ".services.yaml"} {
		t.Run(base, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, base)
			docs, initial := eightServices()
			writeFile(t, path, strings.Join(docs, "---\n"))
			rec, log := startSource(t, path, initial, WithPollInterval(time.Hour), WithDebounce(saveDebounce))

			saveInPieces(t, path, docs)
			time.Sleep(saveDebounce + defaultVanishedGrace + 500*time.Millisecond)
			if got := rec.take(); len(got) != 0 {
				t.Errorf("events after a save of the same content: %q", got)
			}
			if log.String() != "[]" {
				t.Errorf("unexpected errors: %s", log)
			}
		})
	}
}
