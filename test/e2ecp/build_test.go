package e2ecp

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// proxyBinary builds cmd/kube-userspace-proxy once per test binary, into a directory
// removed when the test binary exits, and returns its path.
var proxyBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kup-e2ecp-bin-")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "kube-userspace-proxy")
	root, err := filepath.Abs("../..") // go test runs in test/e2ecp
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kube-userspace-proxy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/kube-userspace-proxy: %v\n%s", err, out)
	}
	return bin, nil
})

// binDir is where proxyBinary put the binary; TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// requireProxy fails t when the proxy cannot be built and returns its path.
func requireProxy(t *testing.T) string {
	t.Helper()
	bin, err := proxyBinary()
	if err != nil {
		t.Fatalf("e2ecp: %v", err)
	}
	return bin
}
