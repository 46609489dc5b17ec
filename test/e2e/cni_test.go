package e2e

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// calico is the client in the Calico-shaped pod (no address on the node's
// side of its veth).
func (e *env) calico() harness.Client {
	return harness.Client{Label: "calico-pod", NS: e.c.CalicoPod, Src: e.c.CalicoPodIP}
}

// cniTargets are the service addresses a pod uses: the "cni" Service's
// ClusterIP and its NodePorts on the node IP, TCP and UDP.
func cniTargets(c *netns.Cluster, s svc) []struct {
	what, proto string
	dst         netip.AddrPort
} {
	np := func(i int) netip.AddrPort { return netip.AddrPortFrom(c.NodeIP, uint16(s.nodePorts[i])) }
	return []struct {
		what, proto string
		dst         netip.AddrPort
	}{
		{"ClusterIP", "tcp", s.tcp()},
		{"ClusterIP", "udp", s.udp()},
		{"NodePort", "tcp", np(0)},
		{"NodePort", "udp", np(1)},
	}
}

// checkPodsOnEveryCNI: with the default --bind-address 0.0.0.0, a pod reaches
// a ClusterIP and a NodePort, TCP and UDP, whether its veth's node side has
// an address (pod1, a routed or bridged CNI) or not (Calico, AWS VPC CNI).
// The legacy REDIRECT dropped the second kind (TestPreroutingRedirect).
func checkPodsOnEveryCNI(t *testing.T, e *env) {
	s := e.svcs["cni"]
	for _, cl := range []harness.Client{e.pod1(ipRR), e.calico()} {
		for _, tc := range cniTargets(e.c, s) {
			got, err := distribution(cl, tc.proto, tc.dst, 3)
			figure(t, "%s %s %s from %s: %s", tc.what, tc.proto, tc.dst, cl.Label, got)
			if err != nil {
				t.Errorf("%s %s %s from %s: %v", tc.what, tc.proto, tc.dst, cl.Label, err)
			}
		}
	}
}

// TestPreroutingRedirect: --prerouting-redirect keeps the legacy REDIRECT
// reachable; pods whose veth has an address are served, and the
// Calico-shaped pod is not, which is why DNAT to the node IP is the default.
func TestPreroutingRedirect(t *testing.T) {
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 1, ClientIPsEach: 1, CalicoPod: true})
	c.StartBackends(t, backendBin, backendPort)
	p := newProxy(t, c, "--prerouting-redirect")
	s := svc{name: "cni", clusterIP: "10.96.0.90", endpoints: ips(c, 0), nodePorts: [2]int32{30090, 30091}}
	writeSvc(t, p.dir, s)
	p.Start(t, startWithin)
	pod := harness.Client{Label: "pod1", NS: c.Pod1, Src: c.Pod1IPs[0]}
	pod.WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
	if rules := p.Rules(t, s.portName("http")); !containsPrefix(rules, "-A KUBE-PORTALS-CONTAINER ", "-j REDIRECT") {
		t.Errorf("--prerouting-redirect: no REDIRECT portal in PREROUTING:\n%v", rules)
	}
	calico := harness.Client{Label: "calico-pod", NS: c.CalicoPod, Src: c.CalicoPodIP}
	for _, tc := range cniTargets(c, s) {
		if _, err := pod.Ask(tc.proto, tc.dst, harness.AnswerTimeout); err != nil {
			t.Errorf("REDIRECT: %s %s %s from pod1 (veth with an address): %v", tc.what, tc.proto, tc.dst, err)
		}
		answer, err := calico.Ask(tc.proto, tc.dst, 700*time.Millisecond)
		figure(t, "REDIRECT: %s %s %s from the Calico-shaped pod: answer %q, err %v", tc.what, tc.proto, tc.dst, answer, err)
		if err == nil {
			t.Errorf("REDIRECT: %s %s %s from the Calico-shaped pod was served by %q; the kernel drops a REDIRECT on an interface without an address, so the test topology is not Calico's",
				tc.what, tc.proto, tc.dst, answer)
		}
	}
}

// containsPrefix reports whether a rule starts with prefix and contains part.
func containsPrefix(rules []string, prefix, part string) bool {
	for _, r := range rules {
		if strings.HasPrefix(r, prefix) && strings.Contains(r, part) {
			return true
		}
	}
	return false
}
