package e2e

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// TestDropPolicyNode: a node firewalled as ufw or firewalld leave it
// (INPUT policy DROP; established traffic and lo accepted). A portal's DNAT
// hands pods' and other hosts' connections to INPUT, where only NodePorts
// were accepted (KUBE-NODEPORT-NON-LOCAL, as the legacy proxier): a
// ClusterIP-only Service timed out from pods while the node itself, whose
// traffic comes in on lo, was served. KUBE-PORTALS-NON-LOCAL accepts them.
// A LoadBalancer's healthCheckNodePort, served on the node port itself with
// no portal, timed out from other hosts while its NodePort answered: a load
// balancer saw the node down. KUBE-NODEPORT-NON-LOCAL accepts it, as
// kube-proxy's KUBE-NODEPORTS.
func TestDropPolicyNode(t *testing.T) {
	c, p, e, s := servedWeb(t)

	c.Node.MustExec("iptables", "-A", "INPUT", "-i", "lo", "-j", "ACCEPT")
	c.Node.MustExec("iptables", "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
	c.Node.MustExec("iptables", "-P", "INPUT", "DROP")
	for _, proto := range []string{"tcp", "udp"} {
		dst := s.tcp()
		if proto == "udp" {
			dst = s.udp()
		}
		e.pod1(0).WaitServed(t, proto, dst, time.Now(), 5*time.Second)
		e.node().WaitServed(t, proto, dst, time.Now(), 5*time.Second)
	}
	if rules := save(t, c.Node); !strings.Contains(rules, "-A KUBE-PORTALS-NON-LOCAL ") {
		t.Errorf("no KUBE-PORTALS-NON-LOCAL rule:\n%s", rules)
	}

	lb := svc{name: "lb", clusterIP: "10.96.0.30", endpoints: ips(c, 0, 1), nodePorts: [2]int32{30310, 30311},
		lbIP: "10.77.60.30", etpLocal: true, localEndpoints: 1, healthCheckNodePort: 30312}
	writeSvc(t, p.dir, lb)
	np := netip.AddrPortFrom(c.NodeExternalIP, uint16(lb.nodePorts[0]))
	e.external().WaitServed(t, "tcp", np, time.Now(), startBudget)
	hc := "http://" + netip.AddrPortFrom(c.NodeExternalIP, uint16(lb.healthCheckNodePort)).String() + "/"
	status, err := 0, error(nil)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		var resp *http.Response
		if resp, err = c.External.HTTPClient(time.Second).Get(hc); err == nil {
			status = resp.StatusCode
			_ = resp.Body.Close()
			break
		}
		time.Sleep(100 * time.Millisecond) // refused: the health server not listening yet
	}
	figure(t, "drop-policy node: healthCheckNodePort %s from outside: status %d, error %v", hc, status, err)
	if status != http.StatusOK {
		t.Errorf("healthCheckNodePort %s from outside: status %d, error %v; want 200 (one local endpoint), as its NodePort %s answers", hc, status, err, np)
	}
	if rules := save(t, c.Node); !strings.Contains(rules, "--dport "+strconv.Itoa(int(lb.healthCheckNodePort))+" ") {
		t.Errorf("no rule accepts healthCheckNodePort %d:\n%s", lb.healthCheckNodePort, rules)
	}
}

// servedWeb is a small cluster of its own (two backends, one client
// address per pod) whose proxy serves one ClusterIP Service, web, already
// answering pod1: for tests that change the node under it.
func servedWeb(t *testing.T) (*netns.Cluster, *proxy, *env, svc) {
	t.Helper()
	return servedWebWith(t, func(*proxy) {})
}

// servedWebWith is servedWeb with a change to the proxy before it starts.
func servedWebWith(t *testing.T, prepare func(*proxy)) (*netns.Cluster, *proxy, *env, svc) {
	t.Helper()
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 2, ClientIPsEach: 1})
	c.StartBackends(t, backendBin, backendPort)
	p := newProxy(t, c)
	prepare(p)
	s := svc{name: "web", clusterIP: "10.96.0.10", endpoints: ips(c, 0, 1)}
	writeSvc(t, p.dir, s)
	p.Start(t, startWithin)
	e := &env{c: c}
	e.pod1(0).WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
	return c, p, e, s
}
