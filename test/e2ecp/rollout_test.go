package e2ecp

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
)

// The rollout: a Service of rolloutReplicas endpoints, each replaced in turn the way a
// Deployment with maxSurge 1 / maxUnavailable 0 does it.
const (
	rolloutReplicas = 20
	// rolloutGrace is how long a terminating backend keeps accepting after it is marked
	// terminating, like a pod's server that exits shortly after SIGTERM.
	rolloutGrace = 300 * time.Millisecond
	// rolloutGap separates one replacement from the next.
	rolloutGap = 200 * time.Millisecond
	// clientPause is what each client waits between two connections.
	clientPause = 5 * time.Millisecond
)

// triggerTimeAnnotation is when the change an EndpointSlice reflects happened.
const triggerTimeAnnotation = "endpoints.kubernetes.io/last-change-trigger-time"

// rolloutMetrics are the proxy's counters the rollout reports.
type rolloutMetrics struct {
	dialFailures, programmed, programmingSeconds float64
}

func readRolloutMetrics(t *testing.T, p *harness.Proxy) rolloutMetrics {
	t.Helper()
	return rolloutMetrics{
		dialFailures:       p.Metric(t, "kubeproxy_userspace_dial_failures_total"),
		programmed:         p.Metric(t, "kubeproxy_network_programming_duration_seconds_count"),
		programmingSeconds: p.Metric(t, "kubeproxy_network_programming_duration_seconds_sum"),
	}
}

func (m rolloutMetrics) minus(o rolloutMetrics) rolloutMetrics {
	return rolloutMetrics{m.dialFailures - o.dialFailures, m.programmed - o.programmed, m.programmingSeconds - o.programmingSeconds}
}

// rolloutIP is the address of the i-th rollout backend: old ones 0..19, new ones 20..39,
// added to the backends namespace next to the shared backends (same /24, so the node
// reaches them directly).
func rolloutIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 77, 1, byte(100 + i)}) }

// load is clients opening connections continuously and counting the failures.
type load struct {
	mu     sync.Mutex
	tried  int
	failed []string // the first few failures, with when they happened
	nfail  int
	byName map[string]int
	stop   chan struct{}
	done   sync.WaitGroup
}

// startLoad runs one goroutine per client, each asking dst over a new TCP connection,
// again and again, until stopLoad.
func startLoad(clients []harness.Client, dst netip.AddrPort, began time.Time) *load {
	l := &load{byName: map[string]int{}, stop: make(chan struct{})}
	for _, c := range clients {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				name, err := c.Ask("tcp", dst, harness.AnswerTimeout)
				l.record(c, name, err, time.Since(began))
				time.Sleep(clientPause)
			}
		}()
	}
	return l
}

func (l *load) record(c harness.Client, name string, err error, at time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tried++
	if err != nil {
		l.nfail++
		if len(l.failed) < 10 {
			l.failed = append(l.failed, fmt.Sprintf("%s at %v: %v", c, at.Round(time.Millisecond), err))
		}
		return
	}
	l.byName[name]++
}

// stopLoad stops the clients and waits for their last connections.
func (l *load) stopLoad() {
	close(l.stop)
	l.done.Wait()
}

// checkRollingUpdate replaces 20 endpoints one at a time while pods connect continuously
// through the ClusterIP: the new backend starts and is added ready; the old one is marked
// ready=false, serving=true, terminating=true; rolloutGrace later its server stops
// accepting (finishing what it accepted); then it leaves the slice. No connection may fail.
func checkRollingUpdate(t *testing.T, e *env) {
	ns := e.cp.Namespace(t)
	for i := range 2 * rolloutReplicas {
		e.lab.Backends.MustIP("addr", "add", netip.PrefixFrom(rolloutIP(i), 24).String(), "dev", "eth0")
	}
	servers := make([]*backend.Server, 2*rolloutReplicas)
	start := func(i int) {
		servers[i] = harness.ServeBackend(t, e.lab.Backends, fmt.Sprintf("r%02d", i), netip.AddrPortFrom(rolloutIP(i), backendPort))
	}
	eps := make([]endpoint, rolloutReplicas)
	for i := range rolloutReplicas {
		start(i)
		eps[i] = endpoint{ip: rolloutIP(i), state: ready}
	}
	svc, slice := createService(t, e.admin, newService(ns, "rollout", 80, 53), eps)
	dst := servicePort(t, svc, tcpPortName)
	var clients []harness.Client
	for i := range rolloutClients {
		clients = append(clients, e.pod(ipRolloutFirst+i))
	}
	// Wait from an address of its own: the polls' SYNs sent before the portal rule
	// exists leave un-NATed conntrack entries (see unNATed) that would fail a load
	// client reusing one of their source ports. The load starts once the rule is there.
	e.pod(ipRolloutProbe).WaitServed(t, "tcp", dst, time.Now(), changePatience)
	t.Logf("un-NATed conntrack entries to %s left by the polls before the rule existed: %d", dst, unNATed(t, e.lab.Node, dst))

	write := func(what string) {
		t.Helper()
		setEndpoints(slice, eps)
		// As the EndpointSlice controller does: the proxy turns it into
		// kubeproxy_network_programming_duration_seconds.
		metav1.SetMetaDataAnnotation(&slice.ObjectMeta, triggerTimeAnnotation, time.Now().Format(time.RFC3339Nano))
		var err error
		slice, err = e.admin.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), slice, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("rollout: %s: %v", what, err)
		}
	}
	before := readRolloutMetrics(t, e.proxy)
	dropsBefore := readNodeDrops(t, e.lab.Node)
	began := time.Now()
	l := startLoad(clients, dst, began)
	stopped := false
	defer func() {
		if !stopped {
			l.stopLoad()
		}
	}()
	time.Sleep(500 * time.Millisecond) // load before the first replacement
	for i := range rolloutReplicas {
		oldIP, newIdx := rolloutIP(i), rolloutReplicas+i
		start(newIdx)
		eps = append(eps, endpoint{ip: rolloutIP(newIdx), state: ready})
		write(fmt.Sprintf("add %s", rolloutIP(newIdx)))
		eps = markTerminating(eps, oldIP)
		write(fmt.Sprintf("mark %s terminating", oldIP))
		time.Sleep(rolloutGrace)
		servers[i].Close()
		eps = without(eps, oldIP)
		write(fmt.Sprintf("remove %s", oldIP))
		time.Sleep(rolloutGap)
	}
	time.Sleep(500 * time.Millisecond) // load after the last replacement
	l.stopLoad()
	stopped = true
	took := time.Since(began)
	during := readRolloutMetrics(t, e.proxy).minus(before)
	drops := readNodeDrops(t, e.lab.Node).minus(dropsBefore)

	newAnswered := 0
	for _, s := range servers[rolloutReplicas:] {
		if s.Answers() > 0 {
			newAnswered++
		}
	}
	t.Logf("FIGURE rollout: %d connections tried, %d failed (%d endpoints replaced one at a time in %v, %d clients; %d of %d new backends answered)",
		l.tried, l.nfail, rolloutReplicas, took.Round(100*time.Millisecond), len(clients), newAnswered, rolloutReplicas)
	t.Logf("FIGURE rollout: proxy dials failed and retried elsewhere: %.0f; network programming duration: %.0f observations, mean %.0f ms",
		during.dialFailures, during.programmed, 1000*during.programmingSeconds/max(during.programmed, 1))
	t.Logf("FIGURE rollout: node packet drops during the rollout: %s", drops)
	if l.nfail > 0 {
		t.Errorf("rollout: %d of %d connections failed; first:\n%s", l.nfail, l.tried, strings.Join(l.failed, "\n"))
	}
	if newAnswered < rolloutReplicas {
		t.Errorf("rollout: only %d of %d new backends were ever used", newAnswered, rolloutReplicas)
	}
	for name := range l.byName {
		if !strings.HasPrefix(name, "r") {
			t.Errorf("rollout: answered by %s, which is no endpoint of the Service", name)
		}
	}
	checkSliceEnd(t, slice, rolloutReplicas)
}

// markTerminating returns eps with the endpoint at ip marked terminating.
func markTerminating(eps []endpoint, ip netip.Addr) []endpoint {
	out := make([]endpoint, len(eps))
	for i, ep := range eps {
		if ep.ip == ip {
			ep.state = terminating
		}
		out[i] = ep
	}
	return out
}

// without returns eps without the endpoint at ip.
func without(eps []endpoint, ip netip.Addr) []endpoint {
	var out []endpoint
	for _, ep := range eps {
		if ep.ip != ip {
			out = append(out, ep)
		}
	}
	return out
}

// checkSliceEnd: after the rollout the slice lists exactly the new backends, all ready.
func checkSliceEnd(t *testing.T, s *discoveryv1.EndpointSlice, n int) {
	t.Helper()
	if len(s.Endpoints) != n {
		t.Errorf("rollout: slice ends with %d endpoints, want %d", len(s.Endpoints), n)
	}
	for _, ep := range s.Endpoints {
		if ep.Conditions.Ready == nil || !*ep.Conditions.Ready {
			t.Errorf("rollout: slice ends with a not-ready endpoint %v", ep.Addresses)
		}
	}
}
