package soak

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const (
	soakNamespace = "soak"
	backendPort   = 8080 // every backend listens here, TCP and UDP
	tcpPort       = 80   // each Service's TCP port, "echo"
	udpPort       = 53   // each Service's UDP port, "dns"
)

// clusterIP is Service i's virtual address.
func clusterIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, 1, byte(1 + i)}) }

func serviceName(i int) string { return fmt.Sprintf("s%02d", i) }

// manifest renders Service i and its one EndpointSlice with the given
// endpoint addresses, as one multi-document YAML file.
func manifest(i int, endpoints []netip.Addr) ([]byte, error) {
	name, ip := serviceName(i), clusterIP(i).String()
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: soakNamespace, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  ip,
			ClusterIPs: []string{ip},
			Ports: []v1.ServicePort{
				{Name: "echo", Protocol: v1.ProtocolTCP, Port: tcpPort, TargetPort: intstr.FromInt32(backendPort)},
				{Name: "dns", Protocol: v1.ProtocolUDP, Port: udpPort, TargetPort: intstr.FromInt32(backendPort)},
			},
		},
	}
	ready := true
	tcp, udp := v1.ProtocolTCP, v1.ProtocolUDP
	echo, dns := "echo", "dns"
	port := int32(backendPort)
	slice := &discovery.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Namespace: soakNamespace, Name: name + "-1",
			Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports: []discovery.EndpointPort{
			{Name: &echo, Protocol: &tcp, Port: &port},
			{Name: &dns, Protocol: &udp, Port: &port},
		},
	}
	for _, a := range endpoints {
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{
			Addresses:  []string{a.String()},
			Conditions: discovery.EndpointConditions{Ready: &ready},
		})
	}
	var data []byte
	for i, obj := range []any{svc, slice} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			data = append(data, "---\n"...)
		}
		data = append(data, b...)
	}
	return data, nil
}

// writeManifest replaces dir/NAME.yaml atomically (written beside the
// directory, renamed in), so the proxy never reads half a file.
func writeManifest(dir string, i int, endpoints []netip.Addr) error {
	data, err := manifest(i, endpoints)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(dir), "."+serviceName(i)+".yaml.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, serviceName(i)+".yaml"))
}
