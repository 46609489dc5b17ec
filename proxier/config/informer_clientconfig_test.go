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

// In a pod, the kubelet's variables say whether the API server is reached
// through the kubernetes Service (which only this proxy would program) or
// at an address the DaemonSet set.
func TestThroughKubernetesService(t *testing.T) {
	for _, tc := range []struct {
		name       string
		host, port string
		serviceVar string // KUBERNETES_PORT_<port>_TCP_ADDR
		want       bool
	}{
		{"kubelet's variables", "10.96.0.1", "443", "10.96.0.1", true},
		{"the control plane set in the pod", "192.168.1.10", "6443", "", false},
		{"host set, port left", "192.168.1.10", "443", "10.96.0.1", false},
		{"not in a pod", "", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", tc.host)
			t.Setenv("KUBERNETES_SERVICE_PORT", tc.port)
			t.Setenv("KUBERNETES_PORT_443_TCP_ADDR", "")
			if tc.serviceVar != "" {
				t.Setenv("KUBERNETES_PORT_"+tc.port+"_TCP_ADDR", tc.serviceVar)
			}
			if _, got := throughKubernetesService(); got != tc.want {
				t.Errorf("throughKubernetesService() = %v, want %v", got, tc.want)
			}
		})
	}
}
