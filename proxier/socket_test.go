package proxier

import (
	"net"
	"testing"
)

// With --bind-address 0.0.0.0 an IPv4 service port listens on IPv4 only;
// gaining an IPv6 address reopens it dual-stack.
func TestProxySocketFamilyFollowsServiceIPs(t *testing.T) {
	p := newTestProxier(t, Options{BindAddress: mustAddr("0.0.0.0")})
	svc := makeService("web")
	p.OnServiceAdd(svc)
	p.Sync()
	listenIP := func() net.IP {
		ap := p.active[p.lbName("default/web:p")]
		return ap.socket.(*tcpProxySocket).addr.IP
	}
	if ip := listenIP(); ip.To4() == nil {
		t.Fatalf("IPv4-only service listens on %v, want 0.0.0.0", ip)
	}
	dual := makeService("web")
	dual.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
	p.OnServiceUpdate(svc, dual)
	p.Sync()
	if ip := listenIP(); ip.To4() != nil {
		t.Fatalf("dual-stack service listens on %v, want ::", ip)
	}
}
