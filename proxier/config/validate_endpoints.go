package config

//lint:file-ignore SA1019 v1.Endpoints is read on purpose: manifests may hold them, and they are converted to EndpointSlices

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func validateEndpointSlice(fe *fieldErrors, es *discovery.EndpointSlice) {
	validateMeta(fe, es.Name, es.Namespace, validation.IsDNS1123Subdomain)
	labelPath := field.NewPath("metadata", "labels").Key(discovery.LabelServiceName)
	if svc, ok := es.Labels[discovery.LabelServiceName]; !ok || svc == "" {
		fe.add(labelPath, "is required: it names the Service this slice belongs to")
	} else {
		dnsCheck(fe, labelPath, svc, validation.IsDNS1035Label)
	}

	at := field.NewPath("addressType")
	switch es.AddressType {
	case discovery.AddressTypeIPv4, discovery.AddressTypeIPv6:
	case discovery.AddressTypeFQDN:
		// Valid for the API server and ignored by kube-proxy and the
		// proxier alike (a Service's IP slices still serve): not an error
		// that names the file.
		return
	default:
		fe.add(at, "%q is not valid (IPv4 or IPv6)", es.AddressType)
		return
	}
	for i, ep := range es.Endpoints {
		path := field.NewPath("endpoints").Index(i).Child("addresses")
		if len(ep.Addresses) == 0 {
			fe.add(path, "at least one address is required")
		}
		for j, addr := range ep.Addresses {
			validateFamilyIP(fe, path.Index(j), addr, es.AddressType)
		}
		// As the API server checks it: "Node-A" would name no node, and
		// under a Local policy such endpoints would never be local.
		if ep.NodeName != nil {
			dnsCheck(fe, field.NewPath("endpoints").Index(i).Child("nodeName"), *ep.NodeName, validation.IsDNS1123Subdomain)
		}
	}
	names := map[string]bool{}
	for i, p := range es.Ports {
		path := field.NewPath("ports").Index(i)
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		if name != "" {
			dnsCheck(fe, path.Child("name"), name, validation.IsDNS1123Label)
		}
		if names[name] {
			fe.add(path.Child("name"), "%q is used by another port", name)
		}
		names[name] = true
		if p.Port != nil {
			validatePortNumber(fe, path.Child("port"), *p.Port)
		}
		if p.Protocol != nil {
			validateProtocol(fe, path.Child("protocol"), *p.Protocol)
		}
	}
}

// validateFamilyIP checks that addr is an IP of the slice's address type.
func validateFamilyIP(fe *fieldErrors, path *field.Path, addr string, t discovery.AddressType) {
	a, ok := validateUnmappedIP(fe, path, addr)
	if !ok {
		return
	}
	if is4 := a.Is4(); is4 != (t == discovery.AddressTypeIPv4) {
		fe.add(path, "%q is not an %s address", addr, t)
	}
}

func validateEndpoints(fe *fieldErrors, e *v1.Endpoints) {
	// An Endpoints object is named after its Service.
	validateMeta(fe, e.Name, e.Namespace, validation.IsDNS1035Label)
	for i, ss := range e.Subsets {
		sp := field.NewPath("subsets").Index(i)
		for j, a := range ss.Addresses {
			validateEndpointAddress(fe, sp.Child("addresses").Index(j), a)
		}
		for j, a := range ss.NotReadyAddresses {
			validateEndpointAddress(fe, sp.Child("notReadyAddresses").Index(j), a)
		}
		names := newPortNames("subset", len(ss.Ports))
		for j, p := range ss.Ports {
			pp := sp.Child("ports").Index(j)
			names.check(fe, pp.Child("name"), p.Name)
			validatePortNumber(fe, pp.Child("port"), p.Port)
			validateProtocol(fe, pp.Child("protocol"), p.Protocol)
		}
	}
}

// validateEndpointAddress checks an Endpoints address as the API server
// does: its IP, and a nodeName that names a node (a slice converted from it
// carries the name, and is checked alike). Unlike the API server, which
// refuses nodeName "" (not a DNS subdomain), it takes an empty one, as
// this source always did: refused, the Endpoints lost all its endpoints
// (the conversion leaves the empty name out).
func validateEndpointAddress(fe *fieldErrors, path *field.Path, a v1.EndpointAddress) {
	validateUnmappedIP(fe, path.Child("ip"), a.IP)
	if a.NodeName != nil && *a.NodeName != "" {
		dnsCheck(fe, path.Child("nodeName"), *a.NodeName, validation.IsDNS1123Subdomain)
	}
}
