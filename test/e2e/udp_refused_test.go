package e2e

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

const ipNoEndpoints = 4 // pod2: UDP to a Service without endpoints

// checkUDPNoEndpointsRefused: a datagram to a UDP Service without endpoints
// is answered with ICMP port unreachable, as kube-proxy's REJECT answers it,
// through the portal's DNAT from a pod (PREROUTING) and from the node
// (OUTPUT): conntrack relates the proxy's error to the flow and rewrites it
// to the ClusterIP, so the client's connected socket gets ECONNREFUSED at
// once instead of waiting out its timeouts.
func checkUDPNoEndpointsRefused(t *testing.T, e *env) {
	s := svc{name: "noeps", clusterIP: "10.96.0.140"}
	writeSvc(t, e.p.dir, s)
	for _, cl := range []harness.Client{e.pod2(ipNoEndpoints), e.node()} {
		var last error
		start := time.Now()
		for refused := false; !refused; {
			if time.Since(start) > startBudget {
				t.Fatalf("%s: UDP to %s without endpoints never refused; last: %v", cl.Label, s.udp(), last)
			}
			var c *net.UDPConn
			err := cl.NS.Do(func() error {
				var laddr *net.UDPAddr
				if cl.Src.IsValid() {
					laddr = &net.UDPAddr{IP: cl.Src.AsSlice()}
				}
				var err error
				c, err = net.DialUDP("udp4", laddr, net.UDPAddrFromAddrPort(s.udp()))
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			sent := time.Now()
			_, _ = c.Write([]byte("query"))
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			_, last = c.Read(make([]byte, 64))
			c.Close()
			if errors.Is(last, syscall.ECONNREFUSED) {
				refused = true
				figure(t, "UDP from %s to %s (no endpoints): ECONNREFUSED %.1f ms after the datagram", cl.Label, s.udp(), float64(time.Since(sent).Microseconds())/1000)
			}
		}
	}
}
