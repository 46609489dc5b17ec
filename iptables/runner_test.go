package iptables

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRestoreWaitFlagOnlyWhereSupported: iptables-restore gets -w 5 only
// from iptables 1.6.2, as kube-proxy decides from the version
// (WaitRestoreMinVersion); an older one refuses the flag, so every restore,
// and so every sync, failed. The binaries are fakes first on PATH, of the
// version of each case: iptables reports it to go-iptables, and an
// iptables-restore older than 1.6.2 refuses -w as the real one does.
func TestRestoreWaitFlagOnlyWhereSupported(t *testing.T) {
	for _, tt := range []struct {
		version, mode string
		wantWait      bool
	}{
		{"1.4.21", "", false}, // CentOS 7
		{"1.6.0", "", false},
		{"1.6.1", "", false},
		{"1.6.2", "", true},
		{"1.8.7", " (nf_tables)", true},
		{"1.8.10", " (legacy)", true},
		{"1.10.0", " (legacy)", true},
	} {
		t.Run(tt.version, func(t *testing.T) {
			dir := t.TempDir()
			argsFile := filepath.Join(dir, "restore-args")
			refuse := ""
			if !tt.wantWait {
				refuse = `for a in "$@"; do case "$a" in -w|--wait*) echo "iptables-restore: invalid option -- 'w'" >&2; exit 1;; esac; done`
			}
			scripts := map[string]string{
				"iptables":      fmt.Sprintf("echo 'iptables v%s%s'", tt.version, tt.mode),
				"iptables-save": fmt.Sprintf("echo 'iptables-save v%s%s'", tt.version, tt.mode),
				"iptables-restore": fmt.Sprintf(`%s
echo "$@" > %s
cat > /dev/null`, refuse, argsFile),
			}
			for name, body := range scripts {
				if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))

			r, err := NewRunner(IPv4)
			if err != nil {
				t.Fatalf("NewRunner: %v", err)
			}
			if err := r.Restore([]byte("*nat\nCOMMIT\n")); err != nil {
				t.Fatalf("Restore with iptables %s: %v", tt.version, err)
			}
			args, err := os.ReadFile(argsFile)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Fields(string(args))
			if hasWait := strings.Contains(" "+string(args), " -w 5"); hasWait != tt.wantWait || got[0] != "--noflush" {
				t.Errorf("iptables %s: iptables-restore %q, want --noflush and wait flag %v", tt.version, got, tt.wantWait)
			}
		})
	}
}
