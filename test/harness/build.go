package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// builds holds what Binary built in this test binary: one temporary
// directory, and per package the executable or why it could not be built, so
// that every test that needs a broken package fails with the build's error.
var builds struct {
	mu   sync.Mutex
	dir  string
	done map[string]build
}

type build struct {
	path string
	err  error
}

// Binary builds the module's main package pkg (a path from the module root,
// such as "./cmd/kube-userspace-proxy") the first time a test asks for it and
// returns the executable's path; it fails t when the build fails. The
// executables live in one temporary directory that Main removes.
func Binary(t testing.TB, pkg string) string {
	t.Helper()
	builds.mu.Lock()
	defer builds.mu.Unlock()
	b, ok := builds.done[pkg]
	if !ok {
		b.path, b.err = buildPackage(pkg)
		if builds.done == nil {
			builds.done = map[string]build{}
		}
		builds.done[pkg] = b
	}
	if b.err != nil {
		t.Fatalf("harness: %v", b.err)
	}
	return b.path
}

// ProxyBinary is Binary of the command under test.
func ProxyBinary(t testing.TB) string { return Binary(t, "./cmd/kube-userspace-proxy") }

// BackendBinary is Binary of test/tools/backend, the backend as a process.
func BackendBinary(t testing.TB) string { return Binary(t, "./test/tools/backend") }

// ModuleRoot is the directory of the module's go.mod, as the go command
// finds it from the working directory (go test runs in the package's).
func ModuleRoot() (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(gomod))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the module (go env GOMOD: %q)", mod)
	}
	return filepath.Dir(mod), nil
}

// buildPackage runs go build from the module root; builds.mu is held.
func buildPackage(pkg string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, err)
	}
	if builds.dir == "" {
		if builds.dir, err = os.MkdirTemp("", "kup-test-bin-"); err != nil {
			return "", err
		}
	}
	bin := filepath.Join(builds.dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}

// Main is the TestMain of a package that uses Binary: it runs the tests,
// removes what Binary built, and exits with the tests' status.
func Main(m *testing.M) {
	code := m.Run()
	builds.mu.Lock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
	}
	builds.mu.Unlock()
	os.Exit(code)
}
