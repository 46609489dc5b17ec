package e2ecp

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// nodeObjectIP is the node's InternalIP in its Node object (registerNode): an address of
// the node namespace that is not on the default-route link, as on a node with a second
// interface for cluster traffic.
var nodeObjectIP = netip.MustParseAddr("10.77.250.1")

// checkNodeIPFromNodeObject: the proxy takes its node IP from the Node object, as kube-proxy
// does, not from the default-route interface: the node's own traffic to a ClusterIP is
// DNATed to the Node's InternalIP, and is served there. It was DNATed to the
// default-route address (10.77.1.1) whatever the Node said.
func checkNodeIPFromNodeObject(t *testing.T, e *env) {
	ns := e.cp.Namespace(t)
	svc, _ := createService(t, e.admin, newService(ns, "node-ip", 80, 53), readyEndpoints(e.backendIPs(0)...))
	fromNode := harness.Client{Label: "node", NS: e.lab.Node}
	fromNode.WaitServed(t, "tcp", servicePort(t, svc, tcpPortName), time.Now(), servedPatience)
	fromNode.WaitServed(t, "udp", servicePort(t, svc, udpPortName), time.Now(), servedPatience)
	rules := append(e.proxy.Rules(t, portName(svc, tcpPortName)), e.proxy.Rules(t, portName(svc, udpPortName))...)
	var host []string
	for _, r := range rules {
		if strings.Contains(r, "KUBE-PORTALS-HOST") {
			host = append(host, r)
		}
	}
	if len(host) == 0 || !allContain("--to-destination "+nodeObjectIP.String()+":")(host) {
		t.Errorf("the node's own portals do not DNAT to the Node's InternalIP %s:\n%s", nodeObjectIP, strings.Join(rules, "\n"))
	}
}
