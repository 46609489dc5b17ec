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

// A rule command killed by a signal did none of its work or all of it
// (iptables-restore commits at COMMIT; the inputs rewrite whole chains):
// it is run again. A signal meant for the proxy's process group (timeout(1),
// kill -- -PGID) reaches a command forked in the instant before it leaves
// that group (Setpgid runs in the child), and the stop's flush of the
// accepts of portal traffic failed with "signal: terminated" under a test
// that signals the group every millisecond (TestStopSignalledWithItsGroup-
// FlushesTheAccepts, once in a loaded run).
func TestRuleCommandKilledBySignalRunsAgain(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	// Killed by SIGTERM on its first two runs, done on the third.
	killedTwice := fmt.Sprintf(`echo run >> %[1]s
if [ "$(wc -l < %[1]s)" -le 2 ]; then kill -TERM $$; sleep 5; fi`, runs)
	scripts := map[string]string{
		"iptables":         "echo 'iptables v1.8.10 (nf_tables)'",
		"iptables-save":    "case \"$1\" in --version) echo 'iptables-save v1.8.10 (nf_tables)'; exit 0;; esac\n" + killedTwice + "\necho '*filter'; echo COMMIT",
		"iptables-restore": killedTwice + "\ncat > /dev/null",
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
	count := func() int {
		b, _ := os.ReadFile(runs)
		_ = os.Remove(runs)
		return strings.Count(string(b), "run")
	}
	err = r.Restore([]byte("*filter\nCOMMIT\n"))
	if n := count(); err != nil || n != 3 {
		t.Errorf("Restore: %v after %d runs; want it run again after the signals (3 runs)", err, n)
	}
	out, err := r.Save(TableFilter)
	if n := count(); err != nil || !strings.Contains(string(out), "*filter") || n != 3 {
		t.Errorf("Save: %q, %v after %d runs; want it run again after the signals (3 runs)", out, err, n)
	}
	cr, ok := r.(concurrentRestorer)
	if !ok {
		t.Fatal("the runner restores no inputs concurrently")
	}
	err = cr.RestoreConcurrently([][]byte{[]byte("*filter\nCOMMIT\n")})
	if n := count(); err != nil || n != 3 {
		t.Errorf("RestoreConcurrently: %v after %d runs; want it run again after the signals (3 runs)", err, n)
	}
	// Restore of Update's deltas (-D and -I lines, which no second run
	// writes the same) is run once and says the signal.
	err = r.Restore([]byte("*nat\n-D KUBE-PORTALS-HOST -d 10.0.0.1/32 -j DNAT\n-I KUBE-PORTALS-HOST 1 -d 10.0.0.2/32 -j DNAT\nCOMMIT\n"))
	if n := count(); err == nil || !strings.Contains(err.Error(), "signal: terminated") || n != 1 {
		t.Errorf("Restore of an update's delta: %v after %d runs; want its signal named after 1 run", err, n)
	}
	// So is Restore of an input that inserts (Sync's jump lines): run
	// again past its COMMIT, each jump was there twice.
	err = r.Restore([]byte("*filter\n:KUBE-PROXY-PORT-GUARD - [0:0]\n-I INPUT 1 -j KUBE-PROXY-PORT-GUARD\nCOMMIT\n"))
	if n := count(); err == nil || !strings.Contains(err.Error(), "signal: terminated") || n != 1 {
		t.Errorf("Restore of jump lines: %v after %d runs; want its signal named after 1 run", err, n)
	}
	err = cr.RestoreConcurrently([][]byte{[]byte("*nat\n:KUBE-PORTALS-HOST - [0:0]\n-A OUTPUT -j KUBE-PORTALS-HOST\nCOMMIT\n")})
	if n := count(); err == nil || !strings.Contains(err.Error(), "signal: terminated") || n != 1 {
		t.Errorf("RestoreConcurrently of jump lines: %v after %d runs; want its signal named after 1 run", err, n)
	}
	// One killed every time fails, saying so.
	if err := os.WriteFile(filepath.Join(dir, "iptables-restore"), []byte("#!/bin/sh\nkill -TERM $$\nsleep 5\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := r.Restore([]byte("*filter\nCOMMIT\n")); err == nil || !strings.Contains(err.Error(), "signal: terminated") {
		t.Errorf("Restore killed every time: %v; want its signal named", err)
	}
}

// The reads go-iptables runs (-C, -S) are run again when a signal killed
// them, as Save and Restore are: go-iptables starts them in the proxy's
// process group, so a signal sent to the group (a Ctrl-C, timeout(1))
// killed a jump repair's -C, and its sync failed with "signal:
// terminated" (go-iptables' error holds the exec.ExitError by value, so
// it was not even recognised as a signal's). A write is not run again: one
// killed after its commit would be doubled.
func TestSingleReadKilledBySignalRunsAgain(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	scripts := map[string]string{
		"iptables": fmt.Sprintf(`case "$1" in --version) echo 'iptables v1.8.10 (nf_tables)'; exit 0;; esac
echo run >> %[1]s
if [ "$(wc -l < %[1]s)" -le 2 ]; then kill -TERM $$; sleep 5; fi`, runs),
		"iptables-save":    "echo 'iptables-save v1.8.10 (nf_tables)'",
		"iptables-restore": "cat > /dev/null",
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
	count := func() int {
		b, _ := os.ReadFile(runs)
		_ = os.Remove(runs)
		return strings.Count(string(b), "run")
	}
	exists, err := r.RuleExists(TableNAT, "PREROUTING", "-j", ChainPortalsContainer)
	if n := count(); err != nil || !exists || n != 3 {
		t.Errorf("RuleExists: %v, %v after %d runs; want it run again after the signals (true after 3 runs)", exists, err, n)
	}
	exists, err = r.ChainExists(TableNAT, ChainPortalsContainer)
	if n := count(); err != nil || !exists || n != 3 {
		t.Errorf("ChainExists: %v, %v after %d runs; want it run again after the signals (true after 3 runs)", exists, err, n)
	}
	err = r.InsertRule(TableNAT, "PREROUTING", 1, "-j", ChainPortalsContainer)
	if n := count(); err == nil || n != 1 {
		t.Errorf("InsertRule killed by a signal: %v after %d runs; want its error after 1 run (a write is not run again)", err, n)
	}
}

// Only an input whose rules all go to chains it declares (which the
// restore flushes) writes the same when run again: Stop's, Sync's in the
// steady state. Sync's jump lines on a first start or a repair, and
// Update's deltas, insert or delete.
func TestRewritesWholeChains(t *testing.T) {
	for _, tc := range []struct {
		name, input string
		want        bool
	}{
		{"stop's flush", "*filter\n:KUBE-NODEPORT-NON-LOCAL - [0:0]\n:KUBE-PORTALS-NON-LOCAL - [0:0]\nCOMMIT\n", true},
		{"chains rewritten, a bucket dropped", "*nat\n:KUBE-PORTALS-HOST - [0:0]\n:KUBE-PORTALS-HOST-1 - [0:0]\n" +
			"-A KUBE-PORTALS-HOST -d 10.0.0.1/32 -p tcp -j DNAT --to-destination 192.168.1.10:40000\n-X KUBE-PORTALS-HOST-1\nCOMMIT\n", true},
		{"a chain declared in the other table's section", "*nat\n:KUBE-PORTALS-HOST - [0:0]\nCOMMIT\n*filter\n-A KUBE-PORTALS-HOST -j ACCEPT\nCOMMIT\n", false},
		{"a first start's jump inserted", "*filter\n:KUBE-PROXY-PORT-GUARD - [0:0]\n-I INPUT 1 -j KUBE-PROXY-PORT-GUARD\nCOMMIT\n", false},
		{"a first start's jump appended", "*nat\n:KUBE-NODEPORT-HOST - [0:0]\n-A OUTPUT -m addrtype --dst-type LOCAL -j KUBE-NODEPORT-HOST\nCOMMIT\n", false},
		{"a duplicate jump deleted", "*nat\n-D PREROUTING -j KUBE-PORTALS-CONTAINER\nCOMMIT\n", false},
		{"an update's delta", "*nat\n-D KUBE-PORTALS-HOST -d 10.0.0.1/32 -j DNAT\n-I KUBE-PORTALS-HOST 1 -d 10.0.0.2/32 -j DNAT\nCOMMIT\n", false},
	} {
		if got := rewritesWholeChains([]byte(tc.input)); got != tc.want {
			t.Errorf("%s: rewritesWholeChains = %v, want %v", tc.name, got, tc.want)
		}
	}
}
