package config

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCheckStateFile: a path --state-file may name is one the first write
// may replace: nothing, an empty file, a List, or the remains of one this
// proxy wrote that no longer decodes (a start must not crash-loop on its
// own damaged state: the next write replaces it). Anything else is refused.
func TestCheckStateFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		ok            bool
	}{
		{"absent", "", true},
		{"empty", "\x00", true}, // written as an empty file
		{"list", `{"kind":"List","apiVersion":"v1","items":[]}`, true},
		{"own, cut short", `{"kind":"List","apiVersion":"v1","metadata":{"annotations":{"kube-userspace`, true},
		{"kubeconfig", "apiVersion: v1\nkind: Config\nclusters: []\n", false},
		{"other JSON", `{"kind":"KubeProxyConfiguration"}`, false},
		{"text", "very important\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			switch tc.content {
			case "":
			case "\x00":
				if err := os.WriteFile(path, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			default:
				if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := CheckStateFile(path)
			if (err == nil) != tc.ok {
				t.Errorf("CheckStateFile = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestStateFileHead: what CheckStateFile takes for the proxy's own file is
// how WriteStateFile's files begin.
func TestStateFileHead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	if err := WriteStateFile(path, State{}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, stateFileHead) {
		t.Errorf("state file begins %.40q, want %q", data, stateFileHead)
	}
}
