package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// env is one running suite: the lab, its backends, the proxy and the
// Services written to its manifests directory.
type env struct {
	c    *netns.Cluster
	p    *proxy
	bs   []netns.Backend
	svcs map[string]svc
}

// pod1 returns a client in pod1 using its i-th address. Each check uses its
// own addresses so that affinity state never leaks between checks.
func (e *env) pod1(i int) harness.Client {
	return harness.Client{Label: fmt.Sprintf("pod1[%s]", e.c.Pod1IPs[i]), NS: e.c.Pod1, Src: e.c.Pod1IPs[i]}
}

func (e *env) pod2(i int) harness.Client {
	return harness.Client{Label: fmt.Sprintf("pod2[%s]", e.c.Pod2IPs[i]), NS: e.c.Pod2, Src: e.c.Pod2IPs[i]}
}

func (e *env) node() harness.Client { return harness.Client{Label: "node", NS: e.c.Node} }

func (e *env) external() harness.Client { return harness.Client{Label: "external", NS: e.c.External} }

// podCIDR is --cluster-cidr: pod1 (10.77.11.0/24), pod2 (10.77.12.0/24)
// and the Calico pod (10.77.13.2), not the external host (10.77.2.2).
const podCIDR = "10.77.8.0/21"

// Client addresses, one set per check (indexes into Pod1IPs / Pod2IPs).
const (
	ipRR        = 0  // pod1: round robin, dead endpoint, back door
	ipSticky    = 1  // pod1: affinity 30/30 (pod2 uses its 0)
	ipTrial1s   = 2  // pod1: 2..13, the 1 s gap trials
	ipTrial4s   = 14 // pod1: 14..25, the 4 s gap trials
	ipRefresh   = 26 // pod1: the every-2-s refresh chain
	ipExpiry    = 27 // pod1: single-client expiry
	ipRepin     = 28 // pod1: re-pin after removal
	ipLive      = 29 // pod1: manifest update latency
	ipKeep      = 30 // pod1: invalid manifest
	ipWarmup    = 31 // pod2: start-up probes only
	ipGSO       = 3  // pod2: a GSO burst
	trialsEach  = 12 // as in the seed
	distConns   = 30 // new connections per distribution
	startBudget = 15 * time.Second
)

// services are the Services the suite starts with; keys are their names.
func services(c *netns.Cluster) map[string]svc {
	b123 := ips(c, 0, 1, 2)
	list := []svc{
		{name: "rr", clusterIP: "10.96.0.10", endpoints: b123},
		{name: "rrnode", clusterIP: "10.96.0.11", endpoints: b123},
		{name: "sticky", clusterIP: "10.96.0.20", endpoints: b123, affinity: true},
		{name: "sticky3", clusterIP: "10.96.0.21", endpoints: b123, affinity: true, timeout: 3},
		{name: "expire3", clusterIP: "10.96.0.22", endpoints: b123, affinity: true, timeout: 3},
		{name: "repin", clusterIP: "10.96.0.23", endpoints: b123, affinity: true},
		{name: "dead", clusterIP: "10.96.0.30", endpoints: append(ips(c, 0, 1, 2), c.DeadIP)},
		{name: "ext", clusterIP: "10.96.0.40", endpoints: b123, nodePorts: [2]int32{30080, 30053},
			externalIPs: []string{"10.77.50.10"}, lbIP: "10.77.60.10"},
		{name: "live", clusterIP: "10.96.0.60", endpoints: ips(c, 0)},
		{name: "doomed", clusterIP: "10.96.0.70", endpoints: ips(c, 0, 1)},
		{name: "keep", clusterIP: "10.96.0.80", endpoints: ips(c, 0)},
		{name: "cni", clusterIP: "10.96.0.90", endpoints: b123, nodePorts: [2]int32{30090, 30091}},
		{name: "local", clusterIP: "10.96.0.100", endpoints: b123, nodePorts: [2]int32{30100, 30101},
			externalIPs: []string{"10.77.50.20"}, lbIP: "10.77.60.20", etpLocal: true},
		{name: "grow", clusterIP: "10.96.0.110", endpoints: b123}, // gets NodePorts 30110/30111 later
		{name: "gso", clusterIP: "10.96.0.120", endpoints: ips(c, 0)},
		{name: "ranges", clusterIP: "10.96.0.130", endpoints: b123, lbIP: "10.77.60.30", sourceRanges: []string{"10.77.11.0/24"}},
	}
	m := map[string]svc{}
	for _, s := range list {
		m[s.name] = s
	}
	return m
}

// TestProxy runs the whole suite against one proxy: the traffic checks in
// parallel (each on its own Service and client addresses), then kill -9 and
// restart, then --cleanup.
func TestProxy(t *testing.T) {
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{CalicoPod: true})
	e := &env{c: c, bs: c.StartBackends(t, backendBin, backendPort), svcs: services(c), p: newProxy(t, c, "--cluster-cidr", podCIDR)}
	for _, s := range e.svcs {
		writeSvc(t, e.p.dir, s)
	}
	began := time.Now()
	e.p.Start(t, startWithin)
	warm := e.pod2(ipWarmup)
	for _, s := range e.svcs {
		warm.WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
		warm.WaitServed(t, "udp", s.udp(), time.Now(), startBudget)
	}
	figure(t, "start-up: %d Services serving TCP+UDP %d ms after exec", len(e.svcs), time.Since(began).Milliseconds())

	t.Run("traffic", func(t *testing.T) {
		for _, check := range []struct {
			name string
			run  func(*testing.T, *env)
		}{
			{"ClusterIPRoundRobinFromPod", checkRoundRobinFromPod},
			{"ClusterIPRoundRobinFromNode", checkRoundRobinFromNode},
			{"AffinityClientIP", checkAffinity},
			{"AffinityTimeoutTrials", checkAffinityTrials},
			{"AffinityExpiry", checkAffinityExpiry},
			{"AffinityRepinAfterRemoval", checkRepin},
			{"DeadEndpointRetried", checkDeadEndpoint},
			{"NodePortExternalIPLoadBalancer", checkExternal},
			{"PodsOnEveryCNI", checkPodsOnEveryCNI},
			{"ExternalTrafficPolicyLocal", checkExternalTrafficPolicyLocal},
			{"NodePortAddedUDPClientKeepsPort", checkNodePortAdded},
			{"ManifestChangeLive", checkLiveUpdate},
			{"ServiceRemoved", checkServiceRemoved},
			{"NoBackDoor", checkNoBackDoor},
			{"InvalidManifestKeepsLastGood", checkInvalidManifestKeepsLastGood},
			{"UDPGSOBurstFromPod", checkGSOBurst},
			{"LoadBalancerSourceRanges", checkSourceRanges},
			{"UDPNoEndpointsRefused", checkUDPNoEndpointsRefused},
		} {
			t.Run(check.name, func(t *testing.T) {
				t.Parallel()
				check.run(t, e)
			})
		}
	})
	t.Run("KillAndRestart", func(t *testing.T) { checkRestart(t, e) })
	t.Run("Cleanup", func(t *testing.T) { checkCleanup(t, e) })
}
