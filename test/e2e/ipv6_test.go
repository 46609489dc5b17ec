package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// familySvc is a test Service of one or both IP families: ports "http"
// (TCP 80) and "dns" (UDP 53) to 8080, one EndpointSlice per family.
type familySvc struct {
	name       string
	clusterIPs []string // the first one's family is primary
	eps        map[discovery.AddressType][]netip.Addr
	nodePorts  [2]int32
	affinity   bool
}

func (s familySvc) objects() []any {
	policy := v1.IPFamilyPolicySingleStack
	if len(s.clusterIPs) == 2 {
		policy = v1.IPFamilyPolicyRequireDualStack
	}
	var families []v1.IPFamily
	for _, ip := range s.clusterIPs {
		if netip.MustParseAddr(ip).Is4() {
			families = append(families, v1.IPv4Protocol)
		} else {
			families = append(families, v1.IPv6Protocol)
		}
	}
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: s.name},
		Spec: v1.ServiceSpec{
			Type:           v1.ServiceTypeClusterIP,
			ClusterIP:      s.clusterIPs[0],
			ClusterIPs:     s.clusterIPs,
			IPFamilies:     families,
			IPFamilyPolicy: &policy,
			Ports: []v1.ServicePort{
				{Name: "http", Protocol: v1.ProtocolTCP, Port: httpPort, TargetPort: intstr.FromInt32(backendPort), NodePort: s.nodePorts[0]},
				{Name: "dns", Protocol: v1.ProtocolUDP, Port: dnsPort, TargetPort: intstr.FromInt32(backendPort), NodePort: s.nodePorts[1]},
			},
		},
	}
	if s.nodePorts[0] != 0 {
		svc.Spec.Type = v1.ServiceTypeNodePort
	}
	if s.affinity {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	}
	objs := []any{svc}
	ready := true
	tcp, udp := v1.ProtocolTCP, v1.ProtocolUDP
	http, dns := "http", "dns"
	port := int32(backendPort)
	for _, at := range []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv6} {
		if len(s.eps[at]) == 0 {
			continue
		}
		es := &discovery.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: fmt.Sprintf("%s-%s", s.name, map[discovery.AddressType]string{discovery.AddressTypeIPv4: "v4", discovery.AddressTypeIPv6: "v6"}[at]),
				Labels: map[string]string{discovery.LabelServiceName: s.name}},
			AddressType: at,
			Ports:       []discovery.EndpointPort{{Name: &http, Protocol: &tcp, Port: &port}, {Name: &dns, Protocol: &udp, Port: &port}},
		}
		for _, a := range s.eps[at] {
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{a.String()}, Conditions: discovery.EndpointConditions{Ready: &ready}})
		}
		objs = append(objs, es)
	}
	return objs
}

func writeFamilySvc(t *testing.T, dir string, s familySvc) {
	t.Helper()
	var data []byte
	for i, obj := range s.objects() {
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			data = append(data, "---\n"...)
		}
		data = append(data, b...)
	}
	if err := os.WriteFile(filepath.Join(dir, s.name+".yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestIPv6 proves IPv6 and dual-stack traffic end to end: real ip6tables
// in the namespaces, the real binary, clients in pods, on the node and on
// the external host. ClusterIP round robin (TCP and UDP, UDP answers from
// the address asked), NodePorts on every node address, ClientIP affinity,
// and a dual-stack Service served on both of its ClusterIPs and NodePorts.
func TestIPv6(t *testing.T) {
	requireSuite(t)
	netns.Require(t, "ip6tables", "ip6tables-save", "ip6tables-restore")
	c := netns.NewCluster(t, netns.ClusterOptions{DualStack: true, ClientIPsEach: 4})
	c.StartBackends(t, backendBin, backendPort)
	c.StartBackends6(t, backendBin, backendPort)
	v6 := c.V6
	b123 := map[discovery.AddressType][]netip.Addr{
		discovery.AddressTypeIPv4: c.BackendIPs[:3],
		discovery.AddressTypeIPv6: v6.BackendIPs[:3],
	}
	only6 := map[discovery.AddressType][]netip.Addr{discovery.AddressTypeIPv6: v6.BackendIPs[:3]}
	svcs := []familySvc{
		{name: "six", clusterIPs: []string{"fd00:96::10"}, eps: only6, nodePorts: [2]int32{30200, 30201}},
		{name: "sixsticky", clusterIPs: []string{"fd00:96::11"}, eps: only6, affinity: true},
		{name: "dual", clusterIPs: []string{"10.96.1.10", "fd00:96::20"}, eps: b123, nodePorts: [2]int32{30210, 30211}},
		{name: "dual6first", clusterIPs: []string{"fd00:96::21", "10.96.1.21"}, eps: b123},
	}
	p := newProxy(t, c)
	for _, s := range svcs {
		writeFamilySvc(t, p.dir, s)
	}
	p.Start(t, startWithin)

	pod6 := func(i int) harness.Client {
		return harness.Client{Label: fmt.Sprintf("pod1[%s]", v6.Pod1IPs[i]), NS: c.Pod1, Src: v6.Pod1IPs[i]}
	}
	pod4 := harness.Client{Label: "pod2[v4]", NS: c.Pod2, Src: c.Pod2IPs[0]}
	node := harness.Client{Label: "node", NS: c.Node}
	ext := harness.Client{Label: "external", NS: c.External}
	at := func(ip string, port int) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port))
	}
	np := func(ip netip.Addr, port int32) netip.AddrPort { return netip.AddrPortFrom(ip, uint16(port)) }
	pod6(0).WaitServed(t, "tcp", at("fd00:96::10", httpPort), time.Now(), startBudget)

	// IPv6 portals DNAT to the node's IPv6 address (that of its IPv6
	// default route), as IPv4 ones do, instead of the legacy REDIRECT
	// (which drops packets from interfaces without an address).
	save, err := c.Node.IPTablesSave(true)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("-d fd00:96::10/128 -p tcp -m comment --comment %q -m tcp --dport 80 -j DNAT --to-destination [%s]:", testNamespace+"/six:http", v6.NodeIP)
	for _, chain := range []string{"KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST"} {
		if !strings.Contains(save, "-A "+chain+" "+want) {
			t.Errorf("%s has no %q:\n%s", chain, want, save)
		}
	}

	roundRobin := []struct {
		what  string
		cl    harness.Client
		proto string
		dst   netip.AddrPort
	}{
		{"IPv6 ClusterIP from a pod", pod6(0), "tcp", at("fd00:96::10", httpPort)},
		{"IPv6 ClusterIP UDP from a pod", pod6(0), "udp", at("fd00:96::10", dnsPort)},
		{"IPv6 ClusterIP from the node", node, "tcp", at("fd00:96::10", httpPort)},
		{"IPv6 ClusterIP UDP from the node", node, "udp", at("fd00:96::10", dnsPort)},
		{"IPv6 NodePort from outside", ext, "tcp", np(v6.NodeExternalIP, 30200)},
		{"IPv6 NodePort UDP from outside", ext, "udp", np(v6.NodeExternalIP, 30201)},
		{"IPv6 NodePort on the node IP from outside", ext, "tcp", np(v6.NodeIP, 30200)},
		{"IPv6 NodePort from a pod", pod6(1), "tcp", np(v6.NodePodIP[0], 30200)},
		{"IPv6 NodePort from the node", node, "tcp", np(v6.NodeIP, 30200)},
		{"IPv6 NodePort UDP from the node", node, "udp", np(v6.NodeIP, 30201)},
		{"dual-stack IPv4 ClusterIP from a pod", pod4, "tcp", at("10.96.1.10", httpPort)},
		{"dual-stack IPv4 ClusterIP UDP from a pod", pod4, "udp", at("10.96.1.10", dnsPort)},
		{"dual-stack IPv6 ClusterIP from a pod", pod6(2), "tcp", at("fd00:96::20", httpPort)},
		{"dual-stack IPv6 ClusterIP UDP from a pod", pod6(2), "udp", at("fd00:96::20", dnsPort)},
		{"dual-stack IPv6-primary, its IPv4 ClusterIP", pod4, "tcp", at("10.96.1.21", httpPort)},
		{"dual-stack IPv6-primary, its IPv6 ClusterIP", pod6(2), "udp", at("fd00:96::21", dnsPort)},
		{"dual-stack IPv4 NodePort from outside", ext, "tcp", np(c.NodeExternalIP, 30210)},
		{"dual-stack IPv6 NodePort from outside", ext, "tcp", np(v6.NodeExternalIP, 30210)},
		{"dual-stack IPv6 NodePort UDP from outside", ext, "udp", np(v6.NodeExternalIP, 30211)},
		{"dual-stack IPv4 NodePort UDP from the node", node, "udp", np(c.NodeIP, 30211)},
		{"dual-stack IPv6 NodePort from the node", node, "tcp", np(v6.NodeIP, 30210)},
	}
	for _, tc := range roundRobin {
		// Each family is served by its own endpoints (IPv6 backends are
		// b1v6..b3v6), a dual-stack Service's too, as kube-proxy does.
		suffix := ""
		if tc.dst.Addr().Is6() {
			suffix = "v6"
		}
		got, err := distribution(tc.cl, tc.proto, tc.dst, 3)
		figure(t, "%s: %s %s from %s: %s", tc.what, tc.proto, tc.dst, tc.cl.Label, got)
		if err != nil || got["b1"+suffix] != 1 || got["b2"+suffix] != 1 || got["b3"+suffix] != 1 {
			t.Errorf("%s (%s %s from %s): %v, want b1%s b2%s b3%s once each: %v", tc.what, tc.proto, tc.dst, tc.cl.Label, got, suffix, suffix, suffix, err)
		}
	}

	// [::1]:NodePort is not the Service's, as kube-proxy leaves ::1 out of
	// its NodePorts ("! -d ::1/128"); 127.0.0.1:NodePort is (kube-proxy's
	// localhostNodePorts). It was served.
	loopback := netip.AddrPortFrom(netip.IPv6Loopback(), 30200)
	if answer, err := node.Ask("tcp", loopback, time.Second); err == nil {
		t.Errorf("%s from the node: answered by %s, want refused (kube-proxy serves no IPv6 loopback NodePort)", loopback, answer)
	}
	if answer, err := node.Ask("tcp", np(netip.MustParseAddr("127.0.0.1"), 30210), harness.AnswerTimeout); err != nil {
		t.Errorf("127.0.0.1:30210 from the node: %q, %v; want served, as kube-proxy's localhostNodePorts", answer, err)
	}

	// ClientIP affinity over IPv6: each client sticks to one backend.
	for i := range 3 {
		for _, proto := range []string{"tcp", "udp"} {
			port := httpPort
			if proto == "udp" {
				port = dnsPort
			}
			got, err := distribution(pod6(i), proto, at("fd00:96::11", port), 6)
			figure(t, "IPv6 affinity %s from %s: %s", proto, pod6(i).Label, got)
			sixOnly := true
			for name := range got {
				sixOnly = sixOnly && strings.HasSuffix(name, "v6")
			}
			if err != nil || len(got) != 1 || !sixOnly {
				t.Errorf("IPv6 affinity %s from %s: %v, want one backend: %v", proto, pod6(i).Label, got, err)
			}
		}
	}
}
