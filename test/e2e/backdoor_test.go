package e2e

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// checkNoBackDoor: the proxy sockets listen on 0.0.0.0, but a connection
// straight to a proxy port — not through a portal or NodePort rule — must be
// dropped, from a pod and from the external host, TCP and UDP, for a
// ClusterIP Service and for a NodePort Service (whose proxy port the
// NodePort ACCEPT rule opens).
func checkNoBackDoor(t *testing.T, e *env) {
	dump := save(t, e.c.Node)
	for _, target := range []struct {
		svc   svc
		port  string
		proto string
	}{
		{e.svcs["rr"], "http", "tcp"},
		{e.svcs["rr"], "dns", "udp"},
		{e.svcs["ext"], "http", "tcp"},
		{e.svcs["ext"], "dns", "udp"},
	} {
		name := target.svc.portName(target.port)
		port, ok := proxyPort(dump, name)
		if !ok {
			t.Errorf("no portal rule with comment %q in iptables-save:\n%s", name, dump)
			continue
		}
		for _, from := range []struct {
			cl  harness.Client
			dst netip.AddrPort
		}{
			{e.pod1(ipRR), netip.AddrPortFrom(e.c.NodePodIP[0], uint16(port))},
			{e.external(), netip.AddrPortFrom(e.c.NodeExternalIP, uint16(port))},
		} {
			answer, err := direct(from.cl, target.proto, from.dst)
			figure(t, "back door: direct %s %s (proxy port of %s) from %s: answer %q, err %v",
				target.proto, from.dst, name, from.cl.Label, answer, err)
			if err == nil {
				t.Errorf("direct %s connection to proxy port %s from %s was served by %q; want it dropped",
					target.proto, from.dst, from.cl.Label, answer)
			}
		}
	}
}

// direct asks a proxy port with a short timeout: a dropped packet shows as a
// timeout, which is the expected outcome. Any answer counts, from whatever
// address it came.
func direct(cl harness.Client, proto string, dst netip.AddrPort) (string, error) {
	const wait = 700 * time.Millisecond
	if proto == "udp" {
		a, _, err := cl.AskUDP(dst, wait)
		return a.Backend, err
	}
	a, err := cl.AskTCP(dst, wait)
	return a.Backend, err
}
