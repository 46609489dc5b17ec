package proxier

import (
	"net"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// newTwoFamilyProxier programs both families through fakes; its sockets
// listen on the unspecified address (a dual-stack socket for a port with
// IPv6 addresses), as the binary's default --bind-address does.
func newTwoFamilyProxier(t *testing.T, bind string) (*Proxier, *iptables.FakeRunner, *iptables.FakeRunner) {
	t.Helper()
	fake4, fake6 := iptables.NewFakeRunner(iptables.IPv4), iptables.NewFakeRunner(iptables.IPv6)
	rules4 := iptables.New(fake4, iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.0.2.2")})
	rules6 := iptables.New(fake6, iptables.Config{Family: iptables.IPv6, NodeIP: mustAddr("2001:db8::2")})
	p := newTestProxier(t, Options{IPv4Portals: rules4, IPv6Portals: rules6, BindAddress: mustAddr(bind)})
	return p, fake4, fake6
}

func guardsPort(f *iptables.FakeRunner, port string) bool {
	for _, r := range f.Rules("filter", "KUBE-PROXY-PORT-GUARD") {
		if strings.Contains(r, "--dport "+port+" ") || strings.Contains(r, "--dports ") && strings.Contains(r, port) {
			return true
		}
	}
	return false
}

func portOfAddr(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Every proxy socket is guarded in each family it listens in, whether or
// not a portal of it is there: a dual-stack socket of an IPv6-only Service
// (or of an IPv4-only one with --bind-address ::) and the socket of external
// traffic of a LoadBalancer without an address yet were reachable straight
// from other hosts in the family without a portal (a review's finding).
func TestEverySocketGuardedInEachFamilyItListensIn(t *testing.T) {
	t.Run("IPv6-only Service on the unspecified address", func(t *testing.T) {
		p, fake4, fake6 := newTwoFamilyProxier(t, "0.0.0.0")
		p.OnServiceAdd(makeService("v6only", withClusterIP("fd00::10")))
		p.Sync()
		port := portOfAddr(t, proxyRow(t, p, "default/v6only:p").ProxyAddress)
		if !guardsPort(fake6, port) {
			t.Errorf("IPv6 guard lacks the port of its portal %s", port)
		}
		if !guardsPort(fake4, port) {
			t.Errorf("the dual-stack socket's port %s is not guarded in IPv4, where it listens too; IPv4 guard: %q", port, fake4.Rules("filter", "KUBE-PROXY-PORT-GUARD"))
		}
	})
	t.Run("IPv4-only Service with --bind-address ::", func(t *testing.T) {
		p, fake4, fake6 := newTwoFamilyProxier(t, "::")
		p.OnServiceAdd(makeService("v4only"))
		p.Sync()
		port := portOfAddr(t, proxyRow(t, p, "default/v4only:p").ProxyAddress)
		if !guardsPort(fake4, port) || !guardsPort(fake6, port) {
			t.Errorf("port %s guarded in IPv4 %v, IPv6 %v; want both", port, guardsPort(fake4, port), guardsPort(fake6, port))
		}
	})
	t.Run("external socket without an external address", func(t *testing.T) {
		p, fake4, _ := newTwoFamilyProxier(t, "0.0.0.0")
		svc := makeService("lb")
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		p.OnServiceAdd(svc)
		p.Sync()
		row := proxyRow(t, p, "default/lb:p")
		if row.ExternalProxyAddress == "" {
			t.Skip("no external socket opened: nothing left unguarded")
		}
		if port := portOfAddr(t, row.ExternalProxyAddress); !guardsPort(fake4, port) {
			t.Errorf("the external socket's port %s is not guarded; IPv4 guard: %q", port, fake4.Rules("filter", "KUBE-PROXY-PORT-GUARD"))
		}
	})
}

// proxyRow is a service port's /debug/services row.
func proxyRow(t *testing.T, p *Proxier, servicePort string) DebugServicePort {
	t.Helper()
	for _, r := range p.DebugServices() {
		if r.ServicePort == servicePort {
			return r
		}
	}
	t.Fatalf("no row for %s: %+v", servicePort, p.DebugServices())
	return DebugServicePort{}
}
