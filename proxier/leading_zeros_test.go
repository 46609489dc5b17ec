package proxier

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestLeadingZeroAddressesReadAsKubeProxy: addresses with leading zeros,
// which API servers stored before strict IP validation and keep on
// objects created then, are read as kube-proxy reads them
// (k8s.io/utils/net ParseIPSloppy / ParseCIDRSloppy: decimal). They were
// left out without a word: the Service got no portal, the endpoint no
// traffic, the source range no effect.
func TestLeadingZeroAddressesReadAsKubeProxy(t *testing.T) {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "old"},
		Spec: v1.ServiceSpec{
			Type:      v1.ServiceTypeLoadBalancer,
			ClusterIP: "010.096.0.010", ClusterIPs: []string{"010.096.0.010"},
			ExternalIPs:              []string{"192.000.2.1"},
			LoadBalancerSourceRanges: []string{"010.0.0.0/8"},
			Ports:                    []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30080}},
		},
		Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "198.051.100.09"}}}},
	}
	infos := servicePorts(svc)
	if len(infos) != 1 {
		t.Fatalf("%d service ports, want 1", len(infos))
	}
	a := infos[0]
	for _, c := range []struct {
		what      string
		got, want []netip.Addr
	}{
		{"clusterIPs", a.clusterIPs, []netip.Addr{netip.MustParseAddr("10.96.0.10")}},
		{"externalIPs", a.externalIPs, []netip.Addr{netip.MustParseAddr("192.0.2.1")}},
		{"load balancer IPs", a.loadBalancerIPs, []netip.Addr{netip.MustParseAddr("198.51.100.9")}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s %v, want %v", c.what, c.got, c.want)
		}
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}; !slices.Equal(a.sourceRanges, want) {
		t.Errorf("source ranges %v, want %v", a.sourceRanges, want)
	}

	es := makeSlice("web", v1.ProtocolTCP, "10.0.0.01:80", "10.0.0.2:80")
	got := endpointsByPort(types.NamespacedName{Namespace: "default", Name: "web"}, map[string]*discovery.EndpointSlice{es.Name: es})
	for spn, eps := range got {
		var addrs []string
		for _, e := range eps {
			addrs = append(addrs, e.Addr.String())
		}
		if want := []string{"10.0.0.1:80", "10.0.0.2:80"}; !slices.Equal(addrs, want) {
			t.Errorf("%s: endpoints %v, want %v", spn, addrs, want)
		}
	}
	if len(got) != 1 {
		t.Errorf("%d service ports with endpoints, want 1", len(got))
	}
}
