package faults

import (
	"strconv"

	v1 "k8s.io/api/core/v1"
)

// ForService parses svc's faults annotation against its ports; no
// annotation is no toxics and no error.
func ForService(svc *v1.Service) (map[string][]Toxic, error) {
	value, ok := svc.Annotations[Annotation]
	if !ok {
		return nil, nil
	}
	ports := make([]ServicePort, 0, len(svc.Spec.Ports))
	for _, p := range svc.Spec.Ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(v1.ProtocolTCP)
		}
		ports = append(ports, ServicePort{Name: p.Name, Number: p.Port, Protocol: proto})
	}
	return ParseAnnotation(value, ports)
}

// ProxyName is a service port's name in the fault API:
// <namespace>.<service>.<port name, or number when unnamed>.
func ProxyName(namespace, service, portName string, port int) string {
	if portName == "" {
		portName = strconv.Itoa(port)
	}
	return namespace + "." + service + "." + portName
}
