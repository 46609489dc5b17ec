package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// loopNodePort is the NodePort of the looping Service, and the port of its
// endpoint: the other node's NodePort.
const loopNodePort = 30053

// loopManifest is a selectorless NodePort Service whose one UDP endpoint is
// peer's NodePort of the same Service.
func loopManifest(clusterIP string, peer netip.Addr, family string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {namespace: %[5]s, name: loop}
spec:
  type: NodePort
  clusterIP: %[1]s
  clusterIPs: [%[1]s]
  ipFamilies: [%[4]s]
  ports:
  - {name: dns, protocol: UDP, port: 53, targetPort: %[3]d, nodePort: %[3]d}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: %[5]s
  name: loop-1
  labels: {kubernetes.io/service-name: loop}
addressType: %[4]s
ports:
- {name: dns, protocol: UDP, port: %[3]d}
endpoints:
- addresses: [%[2]s]
  conditions: {ready: true}
`, clusterIP, peer, loopNodePort, family, testNamespace)
}

// TestUDPLoopThroughAnotherNodeEnds: a Service whose endpoint on node A is
// node B's NodePort and on B is A's (a selectorless Service pointed at the
// nodes' NodePorts of itself) is a loop the own-portal check cannot see, as
// the endpoint is not this node's. Each hop was a fresh datagram at the
// node's default TTL, so one datagram went round until a proxy restarted
// (about 3,300 sessions a second evicted at the port's cap on each node).
// A session's backend datagrams now leave with the TTL (hop limit) of the
// client's datagram that opened it, less one, as a router's would: the
// loop ends after about 64 hops, as kube-proxy's DNAT-forwarded one does.
func TestUDPLoopThroughAnotherNodeEnds(t *testing.T) {
	requireSuite(t)
	for _, tc := range []struct {
		family   string
		a, b     netip.Prefix
		aIP, bIP string // the Service's ClusterIP on each node
	}{
		{family: "IPv4", a: netip.MustParsePrefix("10.77.0.1/24"), b: netip.MustParsePrefix("10.77.0.2/24"), aIP: "10.96.7.1", bIP: "10.96.7.2"},
		{family: "IPv6", a: netip.MustParsePrefix("fd77::1/64"), b: netip.MustParsePrefix("fd77::2/64"), aIP: "fd96::7:1", bIP: "fd96::7:2"},
	} {
		t.Run(tc.family, func(t *testing.T) {
			lab := netns.New(t)
			nodeA, nodeB := lab.NS("loopa"), lab.NS("loopb")
			netns.Veth(netns.End{NS: nodeA, If: "eth0"}, netns.End{NS: nodeB, If: "eth0"})
			// nodad: an address still tentative cannot be sent from.
			nodeA.MustIP("addr", "add", tc.a.String(), "dev", "eth0", "nodad")
			nodeB.MustIP("addr", "add", tc.b.String(), "dev", "eth0", "nodad")
			var proxies []*harness.Proxy
			for _, n := range []struct {
				ns        *netns.NS
				name      string
				clusterIP string
				peer      netip.Addr
			}{{nodeA, "node-a", tc.aIP, tc.b.Addr()}, {nodeB, "node-b", tc.bIP, tc.a.Addr()}} {
				dir := filepath.Join(t.TempDir(), "manifests")
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "loop.yaml"), []byte(loopManifest(n.clusterIP, n.peer, tc.family)), 0o644); err != nil {
					t.Fatal(err)
				}
				p := harness.NewProxy(n.ns, proxyBin, n.name, "--manifests", dir)
				p.Start(t, startWithin)
				proxies = append(proxies, p)
			}
			// Both serve the NodePort once their endpoint is in: wait for
			// each one's portal rule before the datagram goes.
			for _, p := range proxies {
				waitRules(t, p, "loop", tc.family == "IPv6")
			}

			conn, err := nodeA.ListenUDP(tc.a.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			probe := []byte("one looping datagram")
			if _, err := conn.WriteToUDPAddrPort(probe, netip.AddrPortFrom(tc.a.Addr(), loopNodePort)); err != nil {
				t.Fatal(err)
			}
			// Each hop adds the probe's length to one proxy's bytes in.
			// Kernel routers stop a packet within 64 hops by default (the
			// sender's TTL); a little more is room for a node whose
			// default is higher.
			const maxHops = 256
			hops := func() int {
				var in float64
				for _, p := range proxies {
					in += p.Metric(t, "kubeproxy_userspace_bytes_total")
				}
				return int(in) / len(probe)
			}
			last, stableSince := -1, time.Now()
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				n := hops()
				if n > maxHops {
					t.Fatalf("one datagram went round the two nodes' proxies %d times and on (want it dropped within %d hops, as its TTL ends a routed loop)", n, maxHops)
				}
				if n != last {
					last, stableSince = n, time.Now()
				} else if n > 1 && time.Since(stableSince) > time.Second {
					t.Logf("FIGURE the loop ended after %d hops", n)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the datagram made %d hops in 20 s", n)
				}
			}
			// It ended where its TTL ran out, dropped and counted there.
			var dropped float64
			for _, p := range proxies {
				dropped += p.Metric(t, "kubeproxy_userspace_connections_failed_total")
			}
			if dropped != 1 {
				t.Errorf("connections_failed_total of the two proxies: %v, want 1 (the datagram whose TTL ran out)", dropped)
			}
			if n := len(proxies[0].LogLines("its TTL ran out here")) + len(proxies[1].LogLines("its TTL ran out here")); n != 1 {
				t.Errorf("the proxies logged %d datagrams dropped with their TTL run out, want 1", n)
			}
		})
	}
}

// waitRules waits until the proxy has programmed a rule commented with the
// Service's name (ip6tables' when v6).
func waitRules(t *testing.T, p *harness.Proxy, name string, v6 bool) {
	t.Helper()
	for deadline := time.Now().Add(startWithin); ; time.Sleep(50 * time.Millisecond) {
		dump, err := p.NS.IPTablesSave(v6)
		if err != nil {
			t.Fatalf("iptables-save: %v", err)
		}
		if len(harness.RulesFor(dump, testNamespace+"/"+name+":dns")) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no rule for %s/%s within %v:\n%s", testNamespace, name, startWithin, p.Proc.Output())
		}
	}
}
