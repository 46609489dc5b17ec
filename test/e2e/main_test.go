package e2e

import (
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// The binaries under test, built by requireSuite on first use.
var proxyBin, backendBin string

func TestMain(m *testing.M) { harness.Main(m) }

// requireSuite skips unless the suite can run here (so nobody else pays for
// the builds), and fails if the binaries cannot be built.
func requireSuite(t *testing.T) {
	t.Helper()
	netns.Require(t, "iptables", "iptables-save", "ss")
	proxyBin = harness.ProxyBinary(t)
	backendBin = harness.BackendBinary(t)
}
