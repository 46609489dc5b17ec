package proxier

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/httpserver"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
)

// The healthCheckNodePort servers' listeners come out of the sync's
// descriptor budget, as proxy sockets and NodePort holds do: they were
// opened without it, so Services with externalTrafficPolicy Local (one
// listener each, per listen address) took the descriptors kept for the
// connections, the rule writes and the proxy's own servers. A server not
// opened for want of descriptors is retried as one whose port is taken.
func TestHealthCheckServersStayWithinDescriptorBudget(t *testing.T) {
	hs := healthcheck.NewServiceHealthServer([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, httpserver.DefaultLimits,
		func(types.NamespacedName, netip.Addr) int { return 0 }, nil)
	t.Cleanup(hs.Close)
	p := newTestProxier(t, Options{ServiceHealth: hs})
	start, _, ok := descriptorsInUse()
	if !ok {
		t.Skip("no /proc/self/fd")
	}
	base, limit := 150, 300 // the budget (listenerRoom) is 172: room for 22
	inUse := func() int { n, _, _ := descriptorsInUse(); return base + n - start }
	p.fds.count = func() (int, int, bool) { return inUse(), limit, true }
	var held []net.Listener
	const services = 40
	for i := range services {
		// A free port for each healthCheckNodePort, held by nobody once the loop ends.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ln)
		svc := makeService(fmt.Sprintf("s%d", i), withClusterIP(fmt.Sprintf("10.96.1.%d", i)), withNodePort(int32(30000+i)))
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		svc.Spec.HealthCheckNodePort = int32(ln.Addr().(*net.TCPAddr).Port)
		p.OnServiceAdd(svc)
	}
	for _, ln := range held {
		ln.Close()
	}
	p.Sync()
	if n, room := inUse(), listenerRoom(limit); n > room {
		t.Errorf("%d descriptors in use after the sync, past the %d that the proxy's listeners may take of the limit %d (%d proxy sockets open)",
			n, room, limit, len(p.active))
	}
	// Descriptors freed: the retry opens every server.
	base = 0
	p.Sync()
	p.Sync()
	for i, ln := range held {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Errorf("s%d: healthCheckNodePort not served after descriptors were freed: %v", i, err)
			continue
		}
		c.Close()
	}
}
