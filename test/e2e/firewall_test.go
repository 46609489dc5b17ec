package e2e

import (
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
func TestDropPolicyNode(t *testing.T) {
	c, _, e, s := servedWeb(t)

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
}

// servedWeb is a small cluster of its own (two backends, one client
// address per pod) whose proxy serves one ClusterIP Service, web, already
// answering pod1: for tests that change the node under it.
func servedWeb(t *testing.T) (*netns.Cluster, *proxy, *env, svc) {
	t.Helper()
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 2, ClientIPsEach: 1})
	c.StartBackends(t, backendBin, backendPort)
	p := newProxy(t, c)
	s := svc{name: "web", clusterIP: "10.96.0.10", endpoints: ips(c, 0, 1)}
	writeSvc(t, p.dir, s)
	p.Start(t, startWithin)
	e := &env{c: c}
	e.pod1(0).WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
	return c, p, e, s
}
