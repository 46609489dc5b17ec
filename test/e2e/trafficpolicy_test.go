package e2e

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// checkExternalTrafficPolicyLocal: a Service with externalTrafficPolicy:
// Local. Without an endpoint on this node, its LB IP, externalIP and
// NodePort are served to the node itself and to pods (source in
// --cluster-cidr) through every endpoint (kube-proxy's shortcut) and
// refused to the external host. With one endpoint on this node the external
// host reaches exactly that one, while the node and pods keep every
// endpoint. Then back to Cluster, and then both traffic policies Local:
// the cluster IP serves this node's endpoints only (none: refused, from the
// node and pods too) and so do the external addresses to the external
// host, while the node and pods still reach every endpoint through the
// external addresses, as kube-proxy's (UsesClusterEndpoints holds for
// every externally accessible port). The Service stays so for the restart.
func checkExternalTrafficPolicyLocal(t *testing.T, e *env) {
	s := e.svcs["local"]
	extIP := netip.AddrPortFrom(netip.MustParseAddr(s.externalIPs[0]), httpPort)
	lbIP := netip.AddrPortFrom(netip.MustParseAddr(s.lbIP), httpPort)
	lbUDP := netip.AddrPortFrom(netip.MustParseAddr(s.lbIP), dnsPort)
	np := func(ip netip.Addr) netip.AddrPort { return netip.AddrPortFrom(ip, uint16(s.nodePorts[0])) }
	pod := e.pod2(1)
	inside := []struct {
		what  string
		cl    harness.Client
		proto string
		dst   netip.AddrPort
	}{
		{"LB IP from the node", e.node(), "tcp", lbIP},
		{"LB IP UDP from the node", e.node(), "udp", lbUDP},
		{"externalIP from the node", e.node(), "tcp", extIP},
		{"NodePort from the node", e.node(), "tcp", np(e.c.NodeIP)},
		{"LB IP from a pod", pod, "tcp", lbIP},
		{"LB IP UDP from a pod", pod, "udp", lbUDP},
		{"externalIP from a pod", pod, "tcp", extIP},
		{"NodePort from a pod", pod, "tcp", np(e.c.NodePodIP[1])},
		{"LB IP from the Calico pod", e.calico(), "tcp", lbIP},
	}
	outside := []struct {
		what string
		dst  netip.AddrPort
	}{
		{"LB IP from outside", lbIP},
		{"externalIP from outside", extIP},
		{"NodePort from outside", np(e.c.NodeExternalIP)},
	}
	policy := "ETP Local"
	wantAll := func(phase string) {
		t.Helper()
		for _, tc := range inside {
			got, err := distribution(tc.cl, tc.proto, tc.dst, 3)
			figure(t, "%s, %s: %s %s %s from %s: %s", policy, phase, tc.what, tc.proto, tc.dst, tc.cl.Label, got)
			if err != nil || len(got) != 3 {
				t.Errorf("%s, %s: %v, want each of b1 b2 b3 once (round robin over every endpoint): %v", phase, tc.what, got, err)
			}
		}
	}

	// The rules as the kernel holds them (the README quotes them).
	printRules := func() {
		if save, err := e.c.Node.IPTablesSave(false); err == nil {
			for _, line := range strings.Split(save, "\n") {
				if strings.Contains(line, `"`+s.portName("http")+`"`) && strings.HasPrefix(line, "-A KUBE-") {
					figure(t, "%s rule: %s", policy, line)
				}
			}
		}
	}
	printRules()
	wantAll("no local endpoint")
	for _, tc := range outside {
		got, err := distribution(e.external(), "tcp", tc.dst, 2)
		figure(t, "ETP Local, no local endpoint: %s %s: %s", tc.what, tc.dst, got)
		if err == nil {
			t.Errorf("no local endpoint, %s: served %v, want refused (Local keeps external traffic on this node)", tc.what, got)
		}
	}

	// One endpoint (b1) moves to this node: outside traffic reaches only it.
	s.localEndpoints = 1
	writeSvc(t, e.p.dir, s)
	e.external().WaitServed(t, "tcp", lbIP, time.Now(), startBudget)
	for _, tc := range outside {
		got, err := distribution(e.external(), "tcp", tc.dst, 3)
		figure(t, "ETP Local, b1 local: %s %s: %s", tc.what, tc.dst, got)
		if err != nil || got["b1"] != 3 {
			t.Errorf("b1 local, %s: %v, want b1 only: %v", tc.what, got, err)
		}
	}
	wantAll("b1 local")

	// Back to Cluster: the external socket closes. An outside UDP client
	// that keeps its source port has a conntrack entry NATing it to that
	// socket's port, and every datagram it sends refreshes the entry: unless
	// the proxy clears it, the client is black-holed for as long as it asks.
	fixed := netip.AddrPortFrom(e.c.ExternalIP, 40054)
	if name, err := fixedPort(e.c.External, fixed).Ask("udp", lbUDP, harness.AnswerTimeout); err != nil || name != "b1" {
		t.Fatalf("b1 local, UDP %s from outside (%s): %q, %v, want b1", lbUDP, fixed, name, err)
	}
	s.etpLocal = false
	writeSvc(t, e.p.dir, s)
	// Fresh clients meeting every endpoint: the change is in.
	waitUntil(t, "policy back to Cluster: UDP "+lbUDP.String()+" from outside served by all three", func() bool {
		got, err := distribution(e.external(), "udp", lbUDP, 3)
		return err == nil && len(got) == 3
	})
	attempts, took, err := askUDPAgain(fixedPort(e.c.External, fixed), lbUDP)
	figure(t, "ETP Local -> Cluster: UDP client from outside keeping source port %s: %d attempt(s) in %d ms, last error %v",
		fixed, attempts, took.Milliseconds(), err)
	if err != nil {
		t.Errorf("policy back to Cluster: UDP %s from outside, same source port %s: no answer in %d tries: %v; its conntrack "+
			"entry still points at the closed external socket's port:\n%s", lbUDP, fixed, attempts, err, conntrackFor(e.c.Node, fixed))
	}

	// Both policies Local, no local endpoint.
	policy = "ETP+ITP Local"
	s.etpLocal, s.itpLocal, s.localEndpoints = true, true, 0
	writeSvc(t, e.p.dir, s)
	// In once the LB IP from outside and the cluster IP from the node are
	// both refused, twice each: one refused probe of the LB IP (what this
	// waited for) can be a loaded node's failure under the Cluster policy
	// before, and the checks below then met that policy (outside and
	// cluster IP clients served by remote endpoints).
	waitUntil(t, "both policies Local: the LB IP from outside and the cluster IP from the node refused", func() bool {
		out, _ := distribution(e.external(), "tcp", lbIP, 2)
		in, _ := distribution(e.node(), "tcp", s.tcp(), 2)
		return out["ERR"] == 2 && in["ERR"] == 2
	})
	waitUntil(t, "both policies Local: LB IP from the node served by all three", func() bool {
		got, err := distribution(e.node(), "tcp", lbIP, 3)
		return err == nil && len(got) == 3
	})
	printRules()
	wantAll("no local endpoint")
	for _, tc := range outside {
		got, err := distribution(e.external(), "tcp", tc.dst, 2)
		figure(t, "%s, no local endpoint: %s %s: %s", policy, tc.what, tc.dst, got)
		if err == nil {
			t.Errorf("both Local, no local endpoint, %s: served %v, want refused", tc.what, got)
		}
	}
	clusterIP := []struct {
		what  string
		cl    harness.Client
		proto string
	}{
		{"cluster IP from the node", e.node(), "tcp"},
		{"cluster IP from a pod", pod, "tcp"},
		{"cluster IP UDP from a pod", pod, "udp"},
	}
	wantLocal := func(phase string, want string) {
		t.Helper()
		for _, tc := range clusterIP {
			dst := s.tcp()
			if tc.proto == "udp" {
				dst = s.udp()
			}
			got, err := distribution(tc.cl, tc.proto, dst, 2)
			figure(t, "%s, %s: %s %s %s: %s", policy, phase, tc.what, tc.proto, dst, got)
			if want == "" && err == nil {
				t.Errorf("both Local, %s, %s: served %v, want refused (internalTrafficPolicy Local: this node's endpoints only)", phase, tc.what, got)
			}
			if want != "" && (err != nil || got[want] != 2) {
				t.Errorf("both Local, %s, %s: %v, want %s only: %v", phase, tc.what, got, want, err)
			}
		}
	}
	wantLocal("no local endpoint", "")

	// b1 on this node: the cluster IP and external clients reach only it,
	// the node and pods every endpoint through the external addresses.
	s.localEndpoints = 1
	writeSvc(t, e.p.dir, s)
	e.external().WaitServed(t, "tcp", lbIP, time.Now(), startBudget)
	for _, tc := range outside {
		got, err := distribution(e.external(), "tcp", tc.dst, 3)
		figure(t, "%s, b1 local: %s %s: %s", policy, tc.what, tc.dst, got)
		if err != nil || got["b1"] != 3 {
			t.Errorf("both Local, b1 local, %s: %v, want b1 only: %v", tc.what, got, err)
		}
	}
	wantLocal("b1 local", "b1")
	wantAll("b1 local")
}

// checkNodePortAdded: a UDP client outside keeps sending, from one source
// port, to a NodePort the Service does not have yet (a syslog or statsd
// sender set up before the Service change reached the node). Its
// datagrams leave an un-NATed conntrack entry that each of them refreshes.
// Once the Service gets that NodePort, the client must be answered: unless
// the proxy clears the entry when a service port's rules change, the
// kernel keeps bypassing the new portal for as long as the client sends.
func checkNodePortAdded(t *testing.T, e *env) {
	s := e.svcs["grow"]
	np := netip.AddrPortFrom(e.c.NodeExternalIP, 30111)
	fixed := netip.AddrPortFrom(e.c.ExternalIP, 40055)
	client := fixedPort(e.c.External, fixed)
	if name, err := client.Ask("udp", np, 300*time.Millisecond); err == nil {
		t.Fatalf("UDP %s answered (%s) before the Service had that NodePort", np, name)
	}
	s.nodePorts = [2]int32{30110, 30111}
	writeSvc(t, e.p.dir, s)
	// A fresh client meeting the NodePort: the rules are in.
	waitUntil(t, "UDP NodePort "+np.String()+" served from outside after it was added", func() bool {
		_, err := e.external().Ask("udp", np, harness.AnswerTimeout)
		return err == nil
	})
	attempts, took, err := askUDPAgain(client, np)
	figure(t, "NodePort added: UDP client from outside that asked before, same source port %s: %d attempt(s) in %d ms, last error %v",
		fixed, attempts, took.Milliseconds(), err)
	if err != nil {
		t.Errorf("NodePort %s added: UDP from outside, same source port %s as before: no answer in %d tries: %v; "+
			"its conntrack entry still bypasses the portal:\n%s", np, fixed, attempts, err, conntrackFor(e.c.Node, fixed))
	}
}
