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
func TestLoadBalancerIngressIPMode(t *testing.T) {
	vip, proxy := v1.LoadBalancerIPModeVIP, v1.LoadBalancerIPModeProxy
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
		}}},
	}
	infos := servicePorts(svc)
	if len(infos) != 1 {
		t.Fatalf("%d service ports, want 1", len(infos))
	}
	want := []netip.Addr{netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")}
	if got := infos[0].loadBalancerIPs; !slices.Equal(got, want) {
		t.Errorf("load balancer portals %v, want %v (ipMode Proxy left out)", got, want)
	}
}
