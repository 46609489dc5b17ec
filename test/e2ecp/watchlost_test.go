package e2ecp

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// proxyAPIAddr is where the proxy of TestWatchConnectionLost reaches kube-apiserver: an
// address of the node's loopback that a DNAT rule sends to kube-apiserver's 127.0.0.1, so
// that a filter rule can cut the proxy's connections and no other.
const proxyAPIAddr = "127.0.0.2"

// watchLostBudget bounds how soon after its connection was lost unnoticed the proxy
// serves a change made meanwhile. client-go's HTTP/2 health check alone pings a
// connection only after 30 s without a frame and waits 15 s for the answer: the change
// came about 30 s late (the connection's last frame was the Service's own events).
const watchLostBudget = 15 * time.Second

// TestWatchConnectionLost: the API server's side of the proxy's connection is reset while
// the proxy's side is not told, as when the API server's host or its load balancer fails
// over, or a NAT entry on the way is lost: an idle watch sends nothing, so nothing tells
// the proxy. An endpoint change made meanwhile must be served soon after the path is back,
// not when the connection is next used.
func TestWatchConnectionLost(t *testing.T) {
	e, bin := setUpWithoutProxy(t)
	node := e.lab.Node
	port := e.cp.Server[strings.LastIndexByte(e.cp.Server, ':')+1:]
	node.MustExec("iptables", "-t", "nat", "-A", "OUTPUT", "-d", proxyAPIAddr, "-p", "tcp", "--dport", port,
		"-j", "DNAT", "--to-destination", "127.0.0.1:"+port)
	e.proxy = newProxyVia(t, e, bin, "https://"+proxyAPIAddr+":"+port)
	e.proxy.Start(t, 20*time.Second)

	ns := e.cp.Namespace(t)
	svc, slice := createService(t, e.admin, newService(ns, "lost", 80, 53), readyEndpoints(e.backendIPs(0)...))
	dst := servicePort(t, svc, tcpPortName)
	pod := e.pod(ipServed)
	pod.WaitServed(t, "tcp", dst, time.Now(), changePatience)

	// kube-apiserver forgets the proxy's connections and the proxy is not told: with every
	// packet of those connections dropped, their kube-apiserver sockets are destroyed
	// (their resets are dropped too).
	cut := []string{"OUTPUT", "-p", "tcp", "-m", "conntrack", "--ctorigdst", proxyAPIAddr, "-j", "DROP"}
	node.MustExec("iptables", append([]string{"-I"}, cut...)...)
	for _, local := range proxyLocalPorts(t, e, port) {
		node.MustExec("ss", "-K", "-t", "src", "127.0.0.1", "sport", "=", ":"+port, "dst", "127.0.0.1", "dport", "=", ":"+local)
	}
	setEndpoints(slice, readyEndpoints(e.backendIPs(1)...))
	if _, err := e.admin.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), slice, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update %s: %v", slice.Name, err)
	}
	node.MustExec("iptables", append([]string{"-D"}, cut...)...)
	healed := time.Now()

	s2 := e.backends[1].Name
	took := pod.WaitFor(t, "tcp", dst, healed, watchLostBudget, "answered by "+s2,
		func(name string, err error) bool { return err == nil && name == s2 })
	t.Logf("FIGURE watch lost: the change was served %d ms after the path was back", took.Milliseconds())
}

// proxyLocalPorts are the local ports of the proxy's connections to kube-apiserver (the
// sockets connected to proxyAPIAddr:port).
func proxyLocalPorts(t *testing.T, e *env, port string) []string {
	t.Helper()
	out := e.lab.Node.MustExec("ss", "-H", "-t", "-n", "state", "established", "dst", proxyAPIAddr, "dport", "=", ":"+port)
	var ports []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		local := f[len(f)-2] // Recv-Q Send-Q Local Peer
		ports = append(ports, local[strings.LastIndexByte(local, ':')+1:])
	}
	if len(ports) == 0 {
		t.Fatalf("the proxy has no connection to %s:%s:\n%s", proxyAPIAddr, port, out)
	}
	return ports
}

// newProxyVia is the suite's proxy with a kubeconfig naming server, which must reach
// kube-apiserver; its certificate is still checked for 127.0.0.1.
func newProxyVia(t *testing.T, e *env, bin, server string) *harness.Proxy {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(e.cp.ProxyKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server, c.TLSServerName = server, "127.0.0.1"
	}
	path := filepath.Join(t.TempDir(), "proxy-via.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return harness.NewProxy(e.lab.Node, bin, nodeName, "--kubeconfig", path)
}

// watchLostHTTP1Budget bounds how soon a change made while an HTTP/1.1 connection of the
// proxy went nowhere is served: the kernel gives the connection up after 11 s of
// unanswered keep-alive probes (apiLiveness), then the watch is made anew. With
// client-go's dialer alone (keep-alive after 30 s idle, then 15 s × 9) it took 166 s.
const watchLostHTTP1Budget = 25 * time.Second

// TestWatchConnectionLostHTTP1: as TestWatchConnectionLost, for an API client that speaks
// HTTP/1.1 (an API server, or a proxy in front of it, without h2; here DISABLE_HTTP2), so
// without client-go's HTTP/2 health check: the packets of the proxy's connections are
// dropped for good (a NAT or load balancer entry lost on the way) while new connections
// pass. An endpoint change made then must be served within seconds.
func TestWatchConnectionLostHTTP1(t *testing.T) {
	e, bin := setUpWithoutProxy(t)
	t.Setenv("DISABLE_HTTP2", "1") // the proxy's environment, not the test's clients (made already)
	node := e.lab.Node
	port := e.cp.Server[strings.LastIndexByte(e.cp.Server, ':')+1:]
	node.MustExec("iptables", "-t", "nat", "-A", "OUTPUT", "-d", proxyAPIAddr, "-p", "tcp", "--dport", port,
		"-j", "DNAT", "--to-destination", "127.0.0.1:"+port)
	e.proxy = newProxyVia(t, e, bin, "https://"+proxyAPIAddr+":"+port)
	e.proxy.Start(t, 20*time.Second)
	if len(e.proxy.LogLines("HTTP2 has been explicitly disabled")) == 0 {
		t.Fatal("the proxy did not say HTTP/2 was disabled")
	}

	ns := e.cp.Namespace(t)
	svc, slice := createService(t, e.admin, newService(ns, "lost1", 80, 53), readyEndpoints(e.backendIPs(0)...))
	dst := servicePort(t, svc, tcpPortName)
	pod := e.pod(ipServed)
	pod.WaitServed(t, "tcp", dst, time.Now(), changePatience)

	// Both directions of the connections the proxy has now; new ones pass.
	locals := strings.Join(proxyLocalPorts(t, e, port), ",")
	node.MustExec("iptables", "-I", "OUTPUT", "-p", "tcp", "--dport", port, "-m", "multiport", "--sports", locals, "-j", "DROP")
	node.MustExec("iptables", "-I", "OUTPUT", "-p", "tcp", "--sport", port, "-m", "multiport", "--dports", locals, "-j", "DROP")
	cut := time.Now()
	setEndpoints(slice, readyEndpoints(e.backendIPs(1)...))
	if _, err := e.admin.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), slice, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update %s: %v", slice.Name, err)
	}

	s2 := e.backends[1].Name
	took := pod.WaitFor(t, "tcp", dst, cut, watchLostHTTP1Budget, "answered by "+s2,
		func(name string, err error) bool { return err == nil && name == s2 })
	t.Logf("FIGURE watch lost (HTTP/1.1): the change was served %d ms after the connections were cut", took.Milliseconds())
}
