package e2ecp

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/controlplane"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

func TestMain(m *testing.M) { harness.Main(m) } // removes the proxy binary it built

// nodeName is the Node object the proxy follows (--hostname-override).
const nodeName = "kup-e2ecp-node"

// env is one running suite: the lab, the control plane on the node's loopback, the
// proxy in the node namespace, and the backends every Service may share.
type env struct {
	lab      *netns.Cluster
	cp       *controlplane.ControlPlane
	admin    kubernetes.Interface
	proxy    *harness.Proxy
	backends []*backend.Server // one per lab.BackendIPs entry, named s1, s2, ...
	// launch starts control-plane processes on a thread that outlives them (see
	// harness.Launcher).
	launch *harness.Launcher
}

// pod returns a client in pod1 that uses the i-th of its addresses; every check uses its
// own addresses, so that no affinity state leaks from one check into another.
func (e *env) pod(i int) harness.Client {
	return harness.Client{NS: e.lab.Pod1, Src: e.lab.Pod1IPs[i]}
}

// backendIPs are the addresses of the shared backends with these indexes.
func (e *env) backendIPs(idx ...int) []netip.Addr {
	ips := make([]netip.Addr, len(idx))
	for i, n := range idx {
		ips[i] = e.backends[n].TCPAddr().Addr()
	}
	return ips
}

// Client addresses of pod1, one per check (indexes into Pod1IPs).
const (
	ipServed = iota
	ipPort
	ipAffinity
	ipExternalIPs
	ipDelete
	ipOutageBefore
	ipOutageAfter
	ipFaults
	ipFaultsInvalid
	ipRestartOutage
	ipRolloutProbe // waits until the rollout's Service is served, before the load starts
	ipRolloutFirst // the rollout's clients use this and the ones after it
	rolloutClients = 4
)

// setUp builds the lab, starts the control plane inside its node namespace, applies
// examples/deploy's RBAC, registers the Node, starts the shared backends and then the
// proxy with the proxy service account's kubeconfig. Everything is undone in t.Cleanup,
// in reverse order: proxy, control plane, backends, namespaces. t must be the top-level
// test: its goroutine is pinned to its thread (see harness.PinThread).
func setUp(t *testing.T) *env {
	t.Helper()
	e, bin := setUpWithoutProxy(t)
	// --state-file: checkRestartDuringOutage restarts the proxy while kube-apiserver is down.
	e.proxy = harness.NewProxy(e.lab.Node, bin, nodeName, "--kubeconfig", e.cp.ProxyKubeconfig,
		"--state-file", filepath.Join(t.TempDir(), "state.json"))
	e.proxy.Start(t, 20*time.Second)
	return e
}

// setUpWithoutProxy is setUp up to the proxy's start, for a test that starts it its own
// way; it returns the proxy binary.
func setUpWithoutProxy(t *testing.T) (*env, string) {
	t.Helper()
	netns.Require(t, "iptables", "iptables-save")
	controlplane.FindBinaries(t) // skips, before anything is created, when not built
	bin := harness.ProxyBinary(t)
	harness.PinThread(t)
	launch := harness.NewLauncher(t)

	lab := netns.NewCluster(t, netns.ClusterOptions{Backends: 4, ClientIPsEach: ipRolloutFirst + rolloutClients})
	e := &env{lab: lab, launch: launch}
	for i, ip := range lab.BackendIPs {
		e.backends = append(e.backends, harness.ServeBackend(t, lab.Backends, fmt.Sprintf("s%d", i+1), netip.AddrPortFrom(ip, backendPort)))
	}
	e.cp = controlplane.Start(t, controlplane.Options{NetNS: lab.Node.Name})
	e.admin = e.cp.AdminClient(t)
	proxyClient, err := kubernetes.NewForConfig(e.cp.ProxyConfig())
	if err != nil {
		t.Fatal(err)
	}
	applyRBAC(t, e.admin, proxyClient)
	lab.Node.MustIP("addr", "add", netip.PrefixFrom(nodeObjectIP, 32).String(), "dev", "lo")
	registerNode(t, e.admin, nodeObjectIP)
	return e, bin
}

// registerNode creates the proxy's Node object, as the kubelet would have.
func registerNode(t *testing.T, admin kubernetes.Interface, ip netip.Addr) {
	t.Helper()
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip.String()}}},
	}
	if _, err := admin.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Node %s: %v", nodeName, err)
	}
}

// TestAgainstControlPlane runs every check against one control plane and one proxy, one
// check at a time (the rollout and the outages want the machine to themselves), the
// outages last because they restart the API server (the second the proxy too).
func TestAgainstControlPlane(t *testing.T) {
	e := setUp(t)
	for _, check := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"ServedWithin1s", checkServedWithin1s},
		{"NodeIPFromNodeObject", checkNodeIPFromNodeObject},
		{"StartingEvent", checkStartingEvent},
		{"ServicePortChange", checkPortChange},
		{"AffinityTimeoutChange", checkAffinityTimeoutChange},
		{"ExternalIPsChange", checkExternalIPsChange},
		{"ServiceDeleted", checkServiceDeleted},
		{"FaultsLive", checkFaultsLive},
		{"FaultsInvalidAnnotation", checkFaultsInvalid},
		{"RollingUpdate", checkRollingUpdate},
		{"LeastPrivilegeWasEnough", checkNoForbidden},
		{"APIServerOutage", checkAPIServerOutage},
		{"RestartDuringOutage", checkRestartDuringOutage},
	} {
		t.Run(check.name, func(t *testing.T) {
			e.proxy.RequireRunning(t)
			check.run(t, e)
		})
	}
	t.Run("Cleanup", func(t *testing.T) { checkCleanup(t, e) })
}

// checkNoForbidden: the proxy ran with examples/deploy's rights only; any request the
// API server refused it shows up in its log as Forbidden. It runs before the outage,
// whose restart may see refusals of its own (checked there).
func checkNoForbidden(t *testing.T, e *env) {
	if lines := e.proxy.LogLines("forbidden"); len(lines) > 0 {
		t.Errorf("the proxy was refused %d requests with examples/deploy's RBAC:\n%s", len(lines), strings.Join(lines, "\n"))
	}
}

// checkCleanup stops the proxy and runs --cleanup in the node namespace: no chain of the
// proxy may be left (the namespace's deletion would hide a cleanup that forgets one).
func checkCleanup(t *testing.T, e *env) {
	e.proxy.Proc.Kill()
	if out, err := e.proxy.Cleanup(); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, out)
	}
	dump, err := e.lab.Node.IPTablesSave(false)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(dump, "\n") {
		if strings.Contains(line, "KUBE-") {
			t.Errorf("left after --cleanup: %s", line)
		}
	}
}
