package iptables

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// On the real kernel, in a namespace of the test's own: both families are
// Present (a fresh namespace, whose nf_tables nat tables do not exist yet,
// must not count as absent); and with ip6tables refusing the nat table as
// on a kernel without ip6table_nat (a wrapper first on PATH: the module
// cannot be taken away from a shared host), IPv6 is not Present and
// CleanupAll cleans IPv4 and succeeds.
func TestKernelPresentAndCleanupWithoutIPv6NAT(t *testing.T) {
	requireRealIptables(t)
	ns := newNetns(t)
	th := startNSThread(t, ns)
	for _, f := range []Family{IPv4, IPv6} {
		var err error
		th.do(func() {
			var r Runner
			if r, err = NewRunner(f); err == nil {
				err = Present(r)
			}
		})
		if err != nil {
			t.Fatalf("%v not present in a fresh namespace: %v", f, err)
		}
	}

	runner := newNSRunner(t, ns, IPv4)
	syncOK(t, New(runner, Config{Family: IPv4}), webPortals())

	// The message and exit status (3) of ip6tables-legacy on such a kernel.
	dir := t.TempDir()
	for _, bin := range []string{"ip6tables", "ip6tables-save", "ip6tables-restore"} {
		real, err := exec.LookPath(bin)
		if err != nil {
			t.Fatal(err)
		}
		script := fmt.Sprintf(`#!/bin/sh
case " $* " in *" nat "*|*" -tnat "*)
	echo "%s v1.8.9 (legacy): can't initialize ip6tables table 'nat': Table does not exist (do you need to insmod?)" >&2
	exit 3;;
esac
exec %s "$@"
`, bin, real)
		if err := os.WriteFile(filepath.Join(dir, bin), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))

	var present, cleanup error
	th.do(func() {
		r, err := NewRunner(IPv6)
		if err != nil {
			present = fmt.Errorf("NewRunner: %w", err)
			return
		}
		present = Present(r)
		cleanup = CleanupAll()
	})
	if present == nil || !strings.Contains(present.Error(), "Table does not exist") {
		t.Errorf("IPv6 without a nat table: Present = %v, want the table's error", present)
	}
	if cleanup != nil {
		t.Errorf("CleanupAll without an IPv6 nat table: %v", cleanup)
	}
	assertKernelClean(t, ns)
}
