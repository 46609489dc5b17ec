package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// nodeName is the proxy's --hostname-override: endpoints with this nodeName
// are local to it.
const nodeName = "node"

// startWithin bounds a start of the proxy, until /healthz answers 200.
const startWithin = 10 * time.Second

// proxy is the binary under test in the node namespace, serving the Services
// written to its manifests directory.
type proxy struct {
	*harness.Proxy
	dir string // manifests directory
}

// newProxy prepares a manifests directory and the proxy that serves it, with
// the common flags plus extra; Start launches it.
func newProxy(t *testing.T, c *netns.Cluster, extra ...string) *proxy {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "manifests")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	flags := append([]string{"--manifests", dir}, extra...)
	return &proxy{Proxy: harness.NewProxy(c.Node, proxyBin, nodeName, flags...), dir: dir}
}
