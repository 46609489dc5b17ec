package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/lockedbuf"
)

const watchedConfig = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmetricsBindAddress: 127.0.0.1:0\n"

// A --config edit ends the proxy as kube-proxy's ends (its supervisor loads
// the new file at restart), but only for content that would start: a
// broken edit, a file gone for a moment or the same bytes written again
// leave it serving.
func TestWatchConfigFile(t *testing.T) {
	check := configChecker([]string{"--config", "x", "--iptables=false", "--bind-address", "127.0.0.1", "--manifests", t.TempDir()})
	tests := []struct {
		name     string
		edit     func(v configVolume) error
		wantExit bool
	}{
		{"same bytes written again", func(v configVolume) error { return os.WriteFile(v.file, []byte(watchedConfig), 0o644) }, false},
		{"removed", func(v configVolume) error { return os.Remove(v.file) }, false},
		{"does not decode", func(v configVolume) error { return os.WriteFile(v.file, []byte(watchedConfig+"bogus: 1\n"), 0o644) }, false},
		{"a value refused", func(v configVolume) error {
			return os.WriteFile(v.file, []byte(watchedConfig+"portRange: 9-1\n"), 0o644)
		}, false},
		// A FIFO blocked the read for good (the watch never saw another
		// change, nor its context end); a sparse 1 TiB file was allocated
		// whole and the runtime died of it.
		{"a FIFO renamed over it", func(v configVolume) error {
			fifo := v.file + ".fifo"
			if err := syscall.Mkfifo(fifo, 0o644); err != nil {
				return err
			}
			return os.Rename(fifo, v.file)
		}, false},
		{"grown to a sparse 1 TiB", func(v configVolume) error { return os.Truncate(v.file, 1<<40) }, false},
		{"a valid change", func(v configVolume) error {
			return os.WriteFile(v.file, []byte(watchedConfig+"iptables: {syncPeriod: 20s}\n"), 0o644)
		}, true},
		{"a ConfigMap's ..data swapped to new content", func(v configVolume) error {
			dir := v.dir
			fresh := filepath.Join(dir, "..2026_12_04_v2")
			if err := os.Mkdir(fresh, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(fresh, "config.conf"), []byte(watchedConfig+"udpIdleTimeout: 5s\n"), 0o644); err != nil {
				return err
			}
			tmp := filepath.Join(dir, "..data_tmp")
			if err := os.Symlink(filepath.Base(fresh), tmp); err != nil {
				return err
			}
			return os.Rename(tmp, filepath.Join(dir, "..data"))
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// As a ConfigMap volume: config.conf → ..data/config.conf.
			dir := t.TempDir()
			first := filepath.Join(dir, "..2026_12_04_v1")
			if err := os.Mkdir(first, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(first, "config.conf"), []byte(watchedConfig), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Base(first), filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "config.conf")
			if err := os.Symlink(filepath.Join("..data", "config.conf"), path); err != nil {
				t.Fatal(err)
			}
			// An exit comes within a few polls; a watch that keeps
			// serving runs until the context ends.
			budget := 500 * time.Millisecond
			if tt.wantExit {
				budget = 10 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- watchConfigFile(ctx, path, []byte(watchedConfig), check, 10*time.Millisecond) }()
			time.Sleep(30 * time.Millisecond)
			if err := tt.edit(configVolume{dir: dir, file: filepath.Join(first, "config.conf")}); err != nil {
				t.Fatal(err)
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(budget + 5*time.Second):
				t.Fatal("the watch is still blocked after its context ended")
			}
			if tt.wantExit && !errors.Is(err, errConfigUpdated) {
				t.Fatalf("watch ended with %v, want %v", err, errConfigUpdated)
			}
			if !tt.wantExit && err != nil {
				t.Fatalf("watch ended with %v, want it to keep serving until the context ends", err)
			}
		})
	}
}

// configVolume is a ConfigMap volume in dir: config.conf → ..data/config.conf,
// ..data → the directory holding file.
type configVolume struct{ dir, file string }

// The command exits 1 with kube-proxy's message when its --config changes.
func TestConfigChangeEndsTheCommand(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(watchedConfig+"healthzBindAddress: 127.0.0.1:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "--config", path, "--iptables=false", "--bind-address", "127.0.0.1", "--manifests", t.TempDir())
	cmd.Env = append(os.Environ(), runAsCommand+"=1")
	var stderr lockedbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	// Edited once the command runs (it has read --config by then).
	for deadline := time.Now().Add(time.Minute); !strings.Contains(stderr.String(), "kube-userspace-proxy running"); {
		if time.Now().After(deadline) {
			t.Fatalf("the command not running after 1 min:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(path, []byte(watchedConfig+"healthzBindAddress: 127.0.0.1:0\nudpIdleTimeout: 3s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("exit: %v, want status 1\n%s", err, stderr.String())
		}
		if !strings.Contains(stderr.String(), "kube-userspace-proxy: content of the proxy server's configuration file was updated") {
			t.Fatalf("no kube-proxy message on stderr:\n%s", stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15 s after --config changed\n%s", stderr.String())
	}
}

// The check of new --config content parses the command line the proxy
// started with: every form runMain accepts must parse there too. `-v=2`
// (README's `-v N`) did not: the check's stand-in for klog's -v had no
// shorthand, so every edit was logged as a configuration that "would not
// start" (unknown shorthand flag: 'v' in -v=2) and the proxy never
// restarted into it.
func TestConfigCheckerParsesRunMainArgs(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.conf")
	if err := os.WriteFile(cfg, []byte(watchedConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"--config", cfg, "--iptables=false", "--bind-address", "127.0.0.1", "--manifests", dir}
	// runMain sets klog's global verbosity: put it back.
	t.Cleanup(func() { runMainParseOnly(t, append(slices.Clone(base), "-v=0", "--vmodule=")) })
	for _, extra := range [][]string{{"-v=2"}, {"-v", "2"}, {"-v2"}, {"--v=2"}, {"--vmodule=proxier=4"}, {"--version=false"}} {
		t.Run(strings.Join(extra, " "), func(t *testing.T) {
			args := append(slices.Clone(base), extra...)
			if code := runMainParseOnly(t, args); code != 0 {
				t.Fatalf("runMain does not take %q (test set-up)", extra)
			}
			if err := configChecker(args)([]byte(watchedConfig + "iptables: {syncPeriod: 20s}\n")); err != nil {
				t.Errorf("a valid change is refused for a proxy started with %q: %v", extra, err)
			}
		})
	}
}

// runMainParseOnly runs runMain's flag parsing and validation on args
// (--init-only: nothing else is done) and returns its exit status.
func runMainParseOnly(t *testing.T, args []string) int {
	t.Helper()
	return runMain(append(slices.Clone(args), "--init-only"))
}
