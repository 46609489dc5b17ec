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

// On a node without IPv6 netfilter (no ip6tables, no IPv6 nat table) the
// proxy sockets listen in IPv4 only, as with --bind-address of an IPv4
// address: IPv6 has no portals and no guard, so a dual-stack socket let
// any IPv6 host reach a proxy port straight, past the portals, the
// loadBalancerSourceRanges and the Local policy's split (a black-box
// tester's finding), and --bind-address :: did so even for an IPv4-only
// Service. kube-proxy serves nothing in a family it has no proxier for.
func TestNoSocketListensInAFamilyWithoutPortals(t *testing.T) {
	for _, bind := range []string{"0.0.0.0", "::"} {
		for _, svc := range []*v1.Service{makeService("v4only"), func() *v1.Service {
			svc := localLB("dual", 0)
			svc.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
			svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.10"}, {IP: "2001:db8::10"}}
			return svc
		}()} {
			t.Run(bind+" "+svc.Name, func(t *testing.T) {
				fake4 := iptables.NewFakeRunner(iptables.IPv4)
				rules4 := iptables.New(fake4, iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.0.2.2")})
				p := newTestProxier(t, Options{IPv4Portals: rules4, BindAddress: mustAddr(bind)})
				p.OnServiceAdd(svc)
				p.Sync()
				row := proxyRow(t, p, "default/"+svc.Name+":p")
				addrs := []string{row.ProxyAddress}
				if row.ExternalProxyAddress != "" {
					addrs = append(addrs, row.ExternalProxyAddress)
				}
				for _, a := range addrs {
					if host, _, _ := net.SplitHostPort(a); host != "0.0.0.0" {
						t.Errorf("proxy address %s; want 0.0.0.0, IPv4 only", a)
					}
					// The port is free in IPv6 when no socket listens there.
					ln, err := net.Listen("tcp6", net.JoinHostPort("::", portOfAddr(t, a)))
					if err != nil {
						t.Errorf("proxy port %s listens in IPv6, with no IPv6 portal nor guard: %v", a, err)
						continue
					}
					ln.Close()
				}
			})
		}
	}
}
