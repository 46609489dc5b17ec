package controlplane

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// Environment variables that control where the binaries come from.
const (
	// EnvBinDir names a directory holding etcd and kube-apiserver; it bypasses build.sh.
	EnvBinDir = "KUP_CONTROLPLANE_BIN"
	// EnvBuild, when set to anything but "" or "0", lets a test build missing binaries
	// (15-20 minutes cold) instead of skipping.
	EnvBuild = "KUP_BUILD_CONTROLPLANE"
)

// Binaries are the paths of the two control-plane programs.
type Binaries struct {
	Etcd, APIServer string
}

var (
	binariesOnce sync.Once
	binaries     Binaries
	binariesErr  error
	binariesSkip string
)

// FindBinaries returns the control-plane binaries, building them when EnvBuild allows it,
// and skips tb with a message saying how to build them otherwise. The lookup runs once
// per test binary.
func FindBinaries(tb testing.TB) Binaries {
	tb.Helper()
	if testing.Short() {
		tb.Skip("control-plane test: skipped with -short (make unit); make test runs it")
	}
	binariesOnce.Do(func() { binaries, binariesSkip, binariesErr = findBinaries() })
	if binariesErr != nil {
		tb.Fatalf("control plane: %v", binariesErr)
	}
	if binariesSkip != "" {
		tb.Skip(binariesSkip)
	}
	return binaries
}

func findBinaries() (Binaries, string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		b := inDir(dir)
		if !b.present() {
			return Binaries{}, "", fmt.Errorf("%s=%s holds no etcd and kube-apiserver", EnvBinDir, dir)
		}
		return b, "", nil
	}
	script, err := buildScript()
	if err != nil {
		return Binaries{}, "", err
	}
	out, err := exec.Command(script, "--print-dir").Output()
	if err != nil {
		return Binaries{}, "", fmt.Errorf("%s --print-dir: %w", script, err)
	}
	if b := inDir(strings.TrimSpace(string(out))); b.present() {
		return b, "", nil
	}
	if v := os.Getenv(EnvBuild); v == "" || v == "0" {
		return Binaries{}, fmt.Sprintf("control plane not built: run %s (15-20 min cold, seconds when cached) "+
			"or set %s=1 to build it from the test", script, EnvBuild), nil
	}
	cmd := exec.Command(script)
	cmd.Stderr = os.Stderr // progress of a long build belongs on the console
	out, err = cmd.Output()
	if err != nil {
		return Binaries{}, "", fmt.Errorf("%s: %w", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	b := inDir(lines[len(lines)-1])
	if !b.present() {
		return Binaries{}, "", fmt.Errorf("%s finished but %s holds no binaries", script, lines[len(lines)-1])
	}
	return b, "", nil
}

func inDir(dir string) Binaries {
	return Binaries{Etcd: filepath.Join(dir, "etcd"), APIServer: filepath.Join(dir, "kube-apiserver")}
}

func (b Binaries) present() bool {
	for _, p := range []string{b.Etcd, b.APIServer} {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// buildScript is test/controlplane/build.sh in the module the test runs in.
func buildScript() (string, error) {
	root, err := harness.ModuleRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "test", "controlplane", "build.sh")
	if _, err := os.Stat(script); err != nil {
		return "", err
	}
	return script, nil
}
