package config

import (
	"path/filepath"
	"testing"
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
			path := filepath.Join(t.TempDir(), base)
			checkSaveInPiecesIsQuiet(t, path, path)
		})
	}
}
