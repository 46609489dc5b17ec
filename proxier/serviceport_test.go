package proxier

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLoadBalancerIngressIPMode: an ingress IP whose ipMode is Proxy gets no
// portal (KEP-1860, as kube-proxy): the load balancer terminates that traffic
// (PROXY protocol, TLS), so pods must reach it instead of being short-cut.
// Only an unset ipMode or VIP gets one, as kube-proxy's IsVIPMode: a mode
// this proxy does not know (a later Kubernetes's, or a typo in a manifest)
// is not taken for VIP.
func TestLoadBalancerIngressIPMode(t *testing.T) {
	vip, proxy, other := v1.LoadBalancerIPModeVIP, v1.LoadBalancerIPModeProxy, v1.LoadBalancerIPMode("Tunnel")
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{
			Type:      v1.ServiceTypeLoadBalancer,
			ClusterIP: "10.96.0.10",
			Ports:     []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30080}},
		},
		Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{
			{IP: "198.51.100.1"},
			{IP: "198.51.100.2", IPMode: &vip},
			{IP: "198.51.100.3", IPMode: &proxy},
			{IP: "198.51.100.4", IPMode: &other},
		}}},
	}
	infos := servicePorts(svc)
	if len(infos) != 1 {
		t.Fatalf("%d service ports, want 1", len(infos))
	}
	want := []netip.Addr{netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")}
	if got := infos[0].loadBalancerIPs; !slices.Equal(got, want) {
		t.Errorf("load balancer portals %v, want %v (ipMode Proxy and unknown modes left out)", got, want)
	}
}

// TestHeadlessServiceHasNoPorts: a headless Service (clusterIP None) is
// not proxied whatever else it lists, as kube-proxy skips it
// (ShouldSkipService) and the API-server source does: one with externalIPs
// (which the API server accepts, warning they are ignored) captured them.
func TestHeadlessServiceHasNoPorts(t *testing.T) {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hl"},
		Spec: v1.ServiceSpec{
			ClusterIP: v1.ClusterIPNone, ClusterIPs: []string{v1.ClusterIPNone},
			ExternalIPs: []string{"192.0.2.61"},
			Ports:       []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	if infos := servicePorts(svc); len(infos) != 0 {
		t.Errorf("headless Service with an externalIP: %d service ports, want none", len(infos))
	}
}

// TestServiceAddressFamilies: externalIPs and LoadBalancer IPs are served
// only in the families of the Service's ClusterIPs, as kube-proxy's
// per-family proxiers: an IPv4-only Service's IPv6 addresses get no portal
// (they used to get one, so the Service answered on a family it does not
// have).
func TestServiceAddressFamilies(t *testing.T) {
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	for _, tc := range []struct {
		name            string
		clusterIPs      []string
		wantExt, wantLB []netip.Addr
	}{
		{"IPv4 only", []string{"10.96.0.10"}, addrs("192.0.2.1"), addrs("198.51.100.1")},
		{"IPv6 only", []string{"fd00::10"}, addrs("2001:db8::1"), addrs("2001:db8:1::1")},
		{"dual-stack", []string{"10.96.0.10", "fd00::10"},
			addrs("192.0.2.1", "2001:db8::1"), addrs("198.51.100.1", "2001:db8:1::1")},
		{"no ClusterIP", nil, addrs("192.0.2.1", "2001:db8::1"), addrs("198.51.100.1", "2001:db8:1::1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &v1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
				Spec: v1.ServiceSpec{
					Type:        v1.ServiceTypeLoadBalancer,
					ClusterIPs:  tc.clusterIPs,
					ExternalIPs: []string{"192.0.2.1", "2001:db8::1"},
					Ports:       []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30080}},
				},
				Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{
					{IP: "198.51.100.1"}, {IP: "2001:db8:1::1"},
				}}},
			}
			if len(tc.clusterIPs) > 0 {
				svc.Spec.ClusterIP = tc.clusterIPs[0]
			}
			infos := servicePorts(svc)
			if len(infos) != 1 {
				t.Fatalf("%d service ports, want 1", len(infos))
			}
			if got := infos[0].externalIPs; !slices.Equal(got, tc.wantExt) {
				t.Errorf("externalIP portals %v, want %v", got, tc.wantExt)
			}
			if got := infos[0].loadBalancerIPs; !slices.Equal(got, tc.wantLB) {
				t.Errorf("load balancer portals %v, want %v", got, tc.wantLB)
			}
		})
	}
}

// TestUnusableServiceAddresses: a loopback, link-local or unspecified
// ClusterIP or LoadBalancer ingress IP (which an API server takes through
// the status, or with an odd --service-cluster-ip-range) gets no portal:
// with one, the node's own connections to 127.0.0.1:80, or any host's to
// the cloud metadata address 169.254.169.254, reached the Service.
func TestUnusableServiceAddresses(t *testing.T) {
	lb := func(clusterIPs []string, ingress ...string) *v1.Service {
		svc := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "lb"},
			Spec: v1.ServiceSpec{
				Type:       v1.ServiceTypeLoadBalancer,
				ClusterIP:  clusterIPs[0],
				ClusterIPs: clusterIPs,
				Ports:      []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30111}},
			},
		}
		for _, ip := range ingress {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
		}
		return svc
	}
	a := netip.MustParseAddr
	infos := servicePorts(lb([]string{"10.96.7.7"}, "127.0.0.1", "198.51.100.1", "169.254.169.254", "0.0.0.0", "::ffff:127.0.0.2"))
	if len(infos) != 1 {
		t.Fatalf("%d service ports, want 1", len(infos))
	}
	if got, want := infos[0].loadBalancerIPs, []netip.Addr{a("198.51.100.1")}; !slices.Equal(got, want) {
		t.Errorf("load balancer portals %v, want %v", got, want)
	}
	infos = servicePorts(lb([]string{"10.96.7.7", "fe80::7"}))
	if len(infos) != 1 {
		t.Fatalf("%d service ports, want 1", len(infos))
	}
	if got, want := infos[0].clusterIPs, []netip.Addr{a("10.96.7.7")}; !slices.Equal(got, want) {
		t.Errorf("cluster IPs %v, want %v", got, want)
	}
	if infos := servicePorts(lb([]string{"127.0.0.8"}, "198.51.100.1")); len(infos) != 0 {
		t.Errorf("Service whose only ClusterIP is loopback: %d service ports (clusterIPs %v), want none", len(infos), infos[0].clusterIPs)
	}
}
