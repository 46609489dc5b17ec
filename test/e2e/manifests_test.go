package e2e

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

const (
	testNamespace = "e2e"
	backendPort   = 8080 // every backend listens here, TCP and UDP
	httpPort      = 80   // the Services' TCP port, named "http"
	dnsPort       = 53   // the Services' UDP port, named "dns"
)

// svc describes one test Service: a TCP port "http" (80→8080) and a UDP port
// "dns" (53→8080), backed by one EndpointSlice.
type svc struct {
	name        string
	clusterIP   string
	endpoints   []netip.Addr
	affinity    bool
	timeout     int32 // ClientIP timeoutSeconds; 0 = default
	nodePorts   [2]int32
	externalIPs []string
	lbIP        string
	// sourceRanges are the LoadBalancer Service's loadBalancerSourceRanges.
	sourceRanges []string
	faults       string // the kube-userspace-proxy/faults annotation; empty: none
	// etpLocal sets externalTrafficPolicy: Local; the first localEndpoints
	// endpoints are on the proxy's node (nodeName), the others nowhere.
	etpLocal       bool
	localEndpoints int
	// itpLocal sets internalTrafficPolicy: Local.
	itpLocal bool
	// healthCheckNodePort is the Service's (externalTrafficPolicy: Local
	// on a LoadBalancer); 0: none.
	healthCheckNodePort int32
	// annotations are added to the Service's (lifetime annotations, say).
	annotations map[string]string
}

// portName is the comment the proxy puts on this Service port's rules.
func (s svc) portName(port string) string { return testNamespace + "/" + s.name + ":" + port }

func (s svc) tcp() netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(s.clusterIP), httpPort)
}

func (s svc) udp() netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(s.clusterIP), dnsPort)
}

func (s svc) service() *v1.Service {
	o := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: s.name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  s.clusterIP,
			ClusterIPs: []string{s.clusterIP},
			Ports: []v1.ServicePort{
				{Name: "http", Protocol: v1.ProtocolTCP, Port: httpPort, TargetPort: intstr.FromInt32(backendPort), NodePort: s.nodePorts[0]},
				{Name: "dns", Protocol: v1.ProtocolUDP, Port: dnsPort, TargetPort: intstr.FromInt32(backendPort), NodePort: s.nodePorts[1]},
			},
			ExternalIPs: s.externalIPs,
		},
	}
	if s.nodePorts[0] != 0 {
		o.Spec.Type = v1.ServiceTypeNodePort
	}
	if s.faults != "" {
		o.Annotations = map[string]string{faultsAnnotation: s.faults}
	}
	for k, v := range s.annotations {
		if o.Annotations == nil {
			o.Annotations = map[string]string{}
		}
		o.Annotations[k] = v
	}
	if s.lbIP != "" {
		o.Spec.Type = v1.ServiceTypeLoadBalancer
		o.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: s.lbIP}}
		o.Spec.LoadBalancerSourceRanges = s.sourceRanges
	}
	if s.etpLocal {
		o.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		o.Spec.HealthCheckNodePort = s.healthCheckNodePort
	}
	if s.itpLocal {
		local := v1.ServiceInternalTrafficPolicyLocal
		o.Spec.InternalTrafficPolicy = &local
	}
	if s.affinity {
		o.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		if s.timeout != 0 {
			to := s.timeout
			o.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &to}}
		}
	}
	return o
}

func (s svc) slice() *discovery.EndpointSlice {
	ready := true
	tcp, udp := v1.ProtocolTCP, v1.ProtocolUDP
	http, dns := "http", "dns"
	port := int32(backendPort)
	o := &discovery.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: s.name + "-1",
			Labels: map[string]string{discovery.LabelServiceName: s.name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports: []discovery.EndpointPort{
			{Name: &http, Protocol: &tcp, Port: &port},
			{Name: &dns, Protocol: &udp, Port: &port},
		},
	}
	for i, a := range s.endpoints {
		ep := discovery.Endpoint{
			Addresses:  []string{a.String()},
			Conditions: discovery.EndpointConditions{Ready: &ready},
		}
		if i < s.localEndpoints {
			node := nodeName
			ep.NodeName = &node
		}
		o.Endpoints = append(o.Endpoints, ep)
	}
	return o
}

// manifestFile is where a Service and its slice live in the manifests dir.
func manifestFile(dir, name string) string { return filepath.Join(dir, name+".yaml") }

// writeSvc (re)writes the Service's manifest file atomically: the new
// content is written next to the directory and renamed in, so the proxy
// never reads a half-written file.
func writeSvc(t *testing.T, dir string, s svc) {
	t.Helper()
	var data []byte
	for i, obj := range []any{s.service(), s.slice()} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatalf("marshal %s: %v", s.name, err)
		}
		if i > 0 {
			data = append(data, "---\n"...)
		}
		data = append(data, b...)
	}
	tmp := filepath.Join(filepath.Dir(dir), "."+s.name+".yaml.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, manifestFile(dir, s.name)); err != nil {
		t.Fatal(err)
	}
}

// removeSvc deletes the Service's manifest file.
func removeSvc(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.Remove(manifestFile(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// ips picks backend addresses by index.
func ips(c *netns.Cluster, idx ...int) []netip.Addr {
	var out []netip.Addr
	for _, i := range idx {
		out = append(out, c.BackendIPs[i])
	}
	return out
}
