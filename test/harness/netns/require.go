package netns

import (
	"os"
	"os/exec"
	"testing"
)

// Require skips t unless the process is root, the run is not -short, and every
// named tool (plus `ip`) is on PATH. Call it first in any test that builds a Lab.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	if testing.Short() {
		// make unit: the fast tests only, also as root (the namespace
		// suites took minutes there and left namespaces behind when
		// interrupted).
		t.Skip("network-namespace test: skipped with -short (make unit); make test runs it")
	}
	if os.Geteuid() != 0 {
		t.Skip("network-namespace test: needs root (creates namespaces, veths and iptables rules); skipping")
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("network-namespace test: %q not found on PATH (install iproute2/iptables); skipping", tool)
		}
	}
}
