package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// noNetAdminChild marks the test binary re-run by
// TestRootWithoutNetAdmin under setpriv.
const noNetAdminChild = "KUP_TEST_NO_NET_ADMIN_CHILD"

// Root without CAP_NET_ADMIN (a container without NET_ADMIN) cannot
// change netfilter rules: the check passed it for its euid 0, the run
// exited 1 with iptables' "Permission denied (you must be root)" and
// --cleanup printed a permission error per chain. The test binary is run
// again as root with CAP_NET_ADMIN dropped from every set; iptables is
// never run (cleanupRules is replaced).
func TestRootWithoutNetAdmin(t *testing.T) {
	if os.Getenv(noNetAdminChild) == "1" {
		if canProgramIptables() {
			t.Error("canProgramIptables() = true without CAP_NET_ADMIN")
		}
		saved := cleanupRules
		cleanupRules = func() error { t.Error("cleanup ran iptables without CAP_NET_ADMIN"); return nil }
		defer func() { cleanupRules = saved }()
		var code int
		stderr := capture(t, &os.Stderr, func() { code = runMain([]string{"--cleanup"}) })
		if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, errNoNetAdminCleanup.Error()) {
			t.Errorf("--cleanup: exit %d, stderr %q; want 1 and the one line %q", code, stderr, errNoNetAdminCleanup)
		}
		return
	}
	if testing.Short() {
		t.Skip("re-runs the test binary under setpriv")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv")
	}
	if !canProgramIptables() {
		t.Skip("this root has no CAP_NET_ADMIN to drop")
	}
	cmd := exec.Command(setpriv, "--inh-caps=-net_admin", "--ambient-caps=-net_admin", "--bounding-set=-net_admin",
		os.Args[0], "-test.run=^TestRootWithoutNetAdmin$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), noNetAdminChild+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("without CAP_NET_ADMIN: %v\n%s", err, out)
	}
}

// The check reads CAP_NET_ADMIN in the effective set, whatever the euid.
func TestCanProgramIptablesReadsNetAdmin(t *testing.T) {
	saved := effectiveCaps
	defer func() { effectiveCaps = saved }()
	for _, tc := range []struct {
		name string
		caps uint64
		err  error
		want bool
	}{
		{"CAP_NET_ADMIN alone", 1 << 12, nil, true},
		{"every capability", ^uint64(0), nil, true},
		{"every capability but CAP_NET_ADMIN", ^uint64(1 << 12), nil, false},
		{"none", 0, nil, false},
		{"capget failed", ^uint64(0), os.ErrPermission, false},
	} {
		effectiveCaps = func() (uint64, error) { return tc.caps, tc.err }
		if got := canProgramIptables(); got != tc.want {
			t.Errorf("%s: canProgramIptables() = %v, want %v", tc.name, got, tc.want)
		}
	}
}
