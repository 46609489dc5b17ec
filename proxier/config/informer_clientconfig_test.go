package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// A client key that is not the certificate's: client-go defers loading
// files to its certificate rotation, which logs "Loading client cert
// failed" and sends no certificate, so the proxy waited for an API server
// that refused it (or, unreachable, called it "not ready") for good. As
// kubectl, the configuration is refused at once, naming the pair.
func TestBuildClientConfigKeyNotTheCertificates(t *testing.T) {
	dir := t.TempDir()
	certPEM, _ := selfSigned(t)
	_, otherKeyPEM := selfSigned(t)
	cert, key := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	if err := os.WriteFile(cert, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, otherKeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kubeconfig")
	body := strings.Replace(testKubeconfig, "user: {token: secret}",
		"user: {client-certificate: "+cert+", client-key: "+key+"}", 1)
	if err := os.WriteFile(kc, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := BuildClientConfig(kc, "")
	if err == nil || !strings.Contains(err.Error(), "private key does not match public key") || !strings.Contains(err.Error(), cert) {
		t.Fatalf("err = %v, want the pair refused, naming %s", err, cert)
	}

	// The matching pair is taken.
	certPEM, keyPEM := selfSigned(t)
	if err := os.WriteFile(cert, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := BuildClientConfig(kc, ""); err != nil {
		t.Fatalf("a matching pair: %v", err)
	}
}

// selfSigned makes a certificate and its key, PEM-encoded.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "client"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// A kubeconfig that parses but names no cluster to use (no
// current-context, the commonest slip; a current-context whose cluster is
// not defined; an empty Config) is refused saying what is missing and what
// to do. It said client-go's "no configuration has been provided, try
// setting KUBERNETES_MASTER environment variable", of a file that was
// provided, and that variable is never read here (BuildConfigFromFlags
// gives client-go no cluster defaults, the one reader of it).
func TestBuildClientConfigNamesNoCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	t.Setenv("KUBERNETES_MASTER", "https://127.0.0.1:6443")
	const clusters = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: secret}
contexts:
- name: x
  context: {cluster: c, user: u}
- name: old
  context: {cluster: gone, user: u}
`
	for _, tt := range []struct {
		name, content string
		want          []string
	}{
		{"no current-context", clusters, []string{"sets no current-context", `its contexts: "old", "x"`, "kubectl config use-context", "--master"}},
		{"a context whose cluster is not defined", clusters + "current-context: old\n", []string{`current-context "old" names cluster "gone", which it does not define`, "--master"}},
		{"empty", "apiVersion: v1\nkind: Config\n", []string{"defines no context", "--master"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kubeconfig")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := BuildClientConfig(path, "")
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range append(tt.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if strings.Contains(err.Error(), "KUBERNETES_MASTER") {
				t.Errorf("error advises KUBERNETES_MASTER, which is not read: %v", err)
			}
		})
	}
}

// TestInClusterPlaceholderHost: examples/deploy/daemonset.yaml applied as it
// is, its KUBERNETES_SERVICE_HOST placeholder not replaced, ran a pod that
// logged "API server not ready ... lookup CONTROL_PLANE_HOST ... no such
// host" and "still unreachable" every 30 s, unready for good. The client
// configuration is refused instead, saying what to set.
func TestInClusterPlaceholderHost(t *testing.T) {
	ds, err := os.ReadFile("../../examples/deploy/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ds), "value: CONTROL_PLANE_HOST\n") {
		t.Fatal("examples/deploy/daemonset.yaml no longer holds the placeholder CONTROL_PLANE_HOST: update this test and BuildClientConfig")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "CONTROL_PLANE_HOST")
	t.Setenv("KUBERNETES_SERVICE_PORT", "6443")
	_, err = BuildClientConfig("", "")
	want := "KUBERNETES_SERVICE_HOST is CONTROL_PLANE_HOST, the placeholder of examples/deploy/daemonset.yaml: set it"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want one containing %q", err, want)
	}
}
