package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: secret}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func TestBuildClientConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(testKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	// Outside a pod whatever the machine running the tests is.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")

	tests := []struct {
		name, kubeconfig, master string
		wantHost, wantErr        string
	}{
		{name: "kubeconfig", kubeconfig: path, wantHost: "https://127.0.0.1:6443"},
		{name: "master overrides the kubeconfig", kubeconfig: path, master: "https://127.0.0.1:7443", wantHost: "https://127.0.0.1:7443"},
		{name: "master alone", master: "http://127.0.0.1:8080", wantHost: "http://127.0.0.1:8080"},
		{name: "neither, outside a pod", wantErr: "not running in a pod"},
		{name: "missing kubeconfig", kubeconfig: path + ".missing", wantErr: "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := BuildClientConfig(tt.kubeconfig, tt.master)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tt.wantHost {
				t.Errorf("Host = %q, want %q", cfg.Host, tt.wantHost)
			}
			if !strings.HasPrefix(cfg.ContentType, "application/vnd.kubernetes.protobuf") {
				t.Errorf("ContentType = %q, want protobuf", cfg.ContentType)
			}
		})
	}
}
