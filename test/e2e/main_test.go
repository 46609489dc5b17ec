package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// Binaries built once per `go test` run by TestMain.
var (
	proxyBin     string
	backendBin   string
	buildErr     error // why proxyBin/backendBin are unusable, if they are
	proxyMissing bool  // cmd/kube-userspace-proxy has no Go files yet
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Geteuid() == 0 { // nobody else can run the suite: don't pay for the builds
		dir, err := os.MkdirTemp("", "kup-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		build(dir)
	}
	return m.Run()
}

// build compiles the proxy and the backend tool from the module root
// (two levels up from this package).
func build(dir string) {
	root, _ := filepath.Abs("../..")
	matches, _ := filepath.Glob(filepath.Join(root, "cmd", "kube-userspace-proxy", "*.go"))
	if len(matches) == 0 {
		proxyMissing = true
	}
	proxyBin = filepath.Join(dir, "kube-userspace-proxy")
	backendBin = filepath.Join(dir, "backend")
	for bin, pkg := range map[string]string{
		backendBin: "./test/tools/backend",
		proxyBin:   "./cmd/kube-userspace-proxy",
	} {
		if pkg == "./cmd/kube-userspace-proxy" && proxyMissing {
			continue
		}
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
			return
		}
	}
}

// requireSuite skips unless the suite can run here, and fails if the
// binaries could not be built.
func requireSuite(t *testing.T) {
	t.Helper()
	netns.Require(t, "iptables", "iptables-save", "ss")
	if buildErr != nil {
		t.Fatalf("e2e: %v", buildErr)
	}
	if proxyMissing {
		t.Skip("e2e: cmd/kube-userspace-proxy has no Go files yet; nothing to test")
	}
}
