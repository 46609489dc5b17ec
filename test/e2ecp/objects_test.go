package e2ecp

import (
	"context"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Every Service of the suite has one TCP and one UDP port, both forwarded to backendPort
// on its endpoints.
const (
	tcpPortName = "tcp"
	udpPortName = "udp"
	backendPort = 8080
)

// newService is a selector-less ClusterIP Service (its EndpointSlices are the test's to
// write, as for any Service without a selector) with a TCP and a UDP port.
func newService(namespace, name string, tcpPort, udpPort int32) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP,
			Ports: []v1.ServicePort{
				{Name: tcpPortName, Protocol: v1.ProtocolTCP, Port: tcpPort, TargetPort: intstr.FromInt32(backendPort)},
				{Name: udpPortName, Protocol: v1.ProtocolUDP, Port: udpPort, TargetPort: intstr.FromInt32(backendPort)},
			},
		},
	}
}

// endpointState is one endpoint's conditions, as the EndpointSlice controller would
// write them for a pod in that phase.
type endpointState int

const (
	ready       endpointState = iota // running and passing its readiness probe
	terminating                      // deleted, still serving during its grace period
)

// endpoint is one address of a slice and its state.
type endpoint struct {
	ip    netip.Addr
	state endpointState
}

// newEndpointSlice is the slice of a Service, with the ports the Service's named ports
// target and the given endpoints in order.
func newEndpointSlice(svc *v1.Service, eps []endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace,
			Name:      svc.Name + "-e2ecp",
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svc.Name,
				discoveryv1.LabelManagedBy:   "e2ecp.kube-userspace-proxy.test",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To(tcpPortName), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](backendPort)},
			{Name: ptr.To(udpPortName), Protocol: ptr.To(v1.ProtocolUDP), Port: ptr.To[int32](backendPort)},
		},
	}
	setEndpoints(s, eps)
	return s
}

// setEndpoints replaces the endpoints of s.
func setEndpoints(s *discoveryv1.EndpointSlice, eps []endpoint) {
	s.Endpoints = make([]discoveryv1.Endpoint, 0, len(eps))
	for _, ep := range eps {
		cond := discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
		if ep.state == terminating {
			cond = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ep.ip.String()}, Conditions: cond})
	}
}

// readyEndpoints lists ips as ready endpoints.
func readyEndpoints(ips ...netip.Addr) []endpoint {
	eps := make([]endpoint, len(ips))
	for i, ip := range ips {
		eps[i] = endpoint{ip: ip, state: ready}
	}
	return eps
}

// createService stores svc and then its EndpointSlice with eps, and returns the stored
// Service (with its allocated ClusterIP) and slice.
func createService(t *testing.T, c kubernetes.Interface, svc *v1.Service, eps []endpoint) (*v1.Service, *discoveryv1.EndpointSlice) {
	t.Helper()
	ctx := context.Background()
	stored, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	slice, err := c.DiscoveryV1().EndpointSlices(svc.Namespace).Create(ctx, newEndpointSlice(stored, eps), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create EndpointSlice for %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return stored, slice
}

// servicePort is the ClusterIP:port of the Service port with that name.
func servicePort(t *testing.T, svc *v1.Service, portName string) netip.AddrPort {
	t.Helper()
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		t.Fatalf("Service %s/%s: ClusterIP %q: %v", svc.Namespace, svc.Name, svc.Spec.ClusterIP, err)
	}
	for _, p := range svc.Spec.Ports {
		if p.Name == portName {
			return netip.AddrPortFrom(ip, uint16(p.Port))
		}
	}
	t.Fatalf("Service %s/%s has no port %q", svc.Namespace, svc.Name, portName)
	return netip.AddrPort{}
}
