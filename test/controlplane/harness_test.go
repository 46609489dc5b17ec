package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// These tests cover the harness's own pieces; they need no control-plane binaries.

func TestWriteCredentials(t *testing.T) {
	dir := t.TempDir()
	c, err := writeCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.adminToken == c.proxyToken || len(c.adminToken) < 32 {
		t.Errorf("tokens %q and %q: want two distinct long tokens", c.adminToken, c.proxyToken)
	}
	csv, err := os.ReadFile(c.tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		c.adminToken + "," + AdminUser + "," + AdminUser + `,"system:masters"`,
		c.proxyToken + "," + ProxyUser + ",",
	} {
		if !strings.Contains(string(csv), want) {
			t.Errorf("token file lacks %q:\n%s", want, csv)
		}
	}
	key, err := os.ReadFile(c.serviceAccountKey)
	if err != nil || !strings.HasPrefix(string(key), "-----BEGIN EC PRIVATE KEY-----") {
		t.Errorf("service-account key: %v %q", err, key)
	}
}

func TestFreePortsAreDistinct(t *testing.T) {
	ports, err := freePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Errorf("ports %v: want 5 distinct positive ports", ports)
		}
		seen[p] = true
	}
}

func TestWriteKubeconfig(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, []byte("not really a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(path, "https://127.0.0.1:1234", ca, "someone", "tok"); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:1234" || cfg.BearerToken != "tok" || string(cfg.CAData) != "not really a certificate" {
		t.Errorf("kubeconfig gives host %q token %q CA %q", cfg.Host, cfg.BearerToken, cfg.CAData)
	}
}

func TestProcessStopAndEarlyExit(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name      string
		args      []string
		wantReady bool
	}{
		{"runs until stopped", []string{"-c", "echo started; exec sleep 60"}, true},
		{"exits early", []string{"-c", "echo dying; exit 3"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logPath := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".log")
			p, err := startProcess("sh", "/bin/sh", tt.args, logPath, "")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.stop(time.Second) })
			started := func() bool { return strings.Contains(tailFile(logPath, 1), "started") }
			err = waitUntil(p, 10*time.Second, started)
			if tt.wantReady {
				if err != nil {
					t.Fatal(err)
				}
				p.stop(5 * time.Second)
				if p.running() {
					t.Error("still running after stop")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "dying") {
				t.Errorf("waitUntil = %v, want the exit with the log's end", err)
			}
		})
	}
}
