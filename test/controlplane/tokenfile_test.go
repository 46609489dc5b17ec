package controlplane_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/controlplane"
)

// A kubeconfig whose user reads its bearer token from a file (tokenFile, as
// a projected service-account token or an in-cluster config's
// BearerTokenFile) keeps the proxy's watches working when the file's token
// is rotated and the old one revoked: the client the proxy builds
// (config.BuildClientConfig, which the command's apiClient only gives QPS,
// burst and content types) keeps the file's path, and client-go reads the
// file again a minute after its last read (a 401 does not make it read
// sooner: the old token is sent until then, as by kube-proxy). Here the API server restarts with only the new token, which cuts
// every watch: the informers must list and watch again with it.
func TestTokenFileRotation(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	applyRBAC(t, cp)
	waitAllowed(t, proxyClient(t, cp))
	admin := cp.AdminClient(t)
	ctx := context.Background()
	ns := cp.Namespace(t)

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	writeToken := func(token string) {
		t.Helper()
		// As the kubelet updates a projected token: a new file renamed in.
		tmp := tokenFile + ".new"
		check(t, os.WriteFile(tmp, []byte(token), 0o600))
		check(t, os.Rename(tmp, tokenFile))
	}
	writeToken(cp.ProxyToken)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.Server, CertificateAuthority: cp.CAFile}
	kc.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{TokenFile: tokenFile}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "proxy"}
	kc.CurrentContext = "test"
	check(t, clientcmd.WriteToFile(*kc, kubeconfig))

	cfg, err := config.BuildClientConfig(kubeconfig, "")
	check(t, err)
	if cfg.BearerTokenFile != tokenFile {
		t.Fatalf("client config BearerTokenFile %q, want %q", cfg.BearerTokenFile, tokenFile)
	}
	proxy, err := kubernetes.NewForConfig(cfg)
	check(t, err)

	createNode(t, admin, "node-1")
	_, err = admin.CoreV1().Services(ns).Create(ctx, clusterIPService(ns, "before"), metav1.CreateOptions{})
	check(t, err)
	rec := &events{}
	runInformerSource(t, ctx, proxy, rec, config.InformerOptions{NodeName: "node-1", NodeHandler: rec})
	rec.waitFor(t, "slices synced", 30*time.Second)
	rec.waitFor(t, "svc add before", 30*time.Second)

	// Rotate: the file gets the new token, the API server comes back
	// knowing only the new one.
	newToken, err := cp.RotateProxyToken()
	check(t, err)
	writeToken(newToken)
	cp.StopAPIServer()
	check(t, cp.StartAPIServer())
	rotated := time.Now()
	old := kubernetes.NewForConfigOrDie(bearer(cp, cp.ProxyToken))
	if _, err := old.CoreV1().Services(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("the old token after the rotation: %v, want 401 Unauthorized (not revoked: no test)", err)
	}

	_, err = admin.CoreV1().Services(ns).Create(ctx, clusterIPService(ns, "after"), metav1.CreateOptions{})
	check(t, err)
	_, err = admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, "after-1", "after", nil), metav1.CreateOptions{})
	check(t, err)
	// client-go reads the file again a minute after its last read (50 s
	// and a 10 s leeway), not at a 401; the reflectors back off up to
	// 30 s between failed lists: 36 s here on a loaded machine.
	rec.waitFor(t, "svc add after", 120*time.Second)
	rec.waitFor(t, "slice add after-1", 30*time.Second)
	t.Logf("watches back with the rotated token %v after the API server", time.Since(rotated).Round(time.Millisecond))
}

// bearer is a client configuration for the API server with token.
func bearer(cp *controlplane.ControlPlane, token string) *rest.Config {
	cfg := rest.CopyConfig(cp.AdminConfig())
	cfg.BearerToken = token
	return cfg
}
