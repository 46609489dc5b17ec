package proxier

//lint:file-ignore SA1019 v1.Endpoints is read on purpose: manifests may hold them, and they are converted to EndpointSlices

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

const fuzzEndpoints = `apiVersion: v1
kind: Endpoints
metadata: {name: web}
subsets:
- addresses: [{ip: 10.1.0.1, nodeName: node}, {ip: "fd00::1"}]
  notReadyAddresses: [{ip: 10.1.0.9}]
  ports: [{name: http, port: 8080}, {name: dns, port: 53, protocol: UDP}]
`

const fuzzSlice = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: ["10.1.0.1"]
  conditions: {ready: true}
  nodeName: node
  zone: a
  hints: {forZones: [{name: a}]}
- addresses: ["10.1.0.2"]
  conditions: {ready: false, serving: true, terminating: true}
`

// FuzzEndpointsConversion: no object panics the way from Endpoints and
// EndpointSlices to balancer endpoints. An Endpoints manifest that decodes
// converts into slices that are valid manifests themselves and hold every
// address once; a slice, validated (manifests) or not (as an informer hands
// it over), yields only endpoints with a plain IP from the slice and the
// slice's port number in 1-65535, one per address and port when the slice
// is valid; and the tracker takes it under every traffic policy.
func FuzzEndpointsConversion(f *testing.F) {
	for _, seed := range []string{
		fuzzEndpoints,
		fuzzSlice,
		`{"addressType":"IPv4","metadata":{"name":"s","labels":{"kubernetes.io/service-name":"web"}},"ports":[{"port":70000}],"endpoints":[{"addresses":["10.0.0.1"]}]}`,
		`{"addressType":"IPv6","metadata":{"name":"s","labels":{"kubernetes.io/service-name":"web"}},"ports":[{"port":-1},{"port":0},{"port":80,"protocol":"SCTP"}],"endpoints":[{"addresses":["fe80::1%eth0","::ffff:10.0.0.1","x"]}]}`,
		`{"metadata":{"name":"s","labels":{"kubernetes.io/service-name":"web"}},"ports":[{}],"endpoints":[{"addresses":[]}]}`,
		"apiVersion: v1\nkind: Endpoints\nmetadata: {name: web}\nsubsets: [{}]\n",
		// nodeName: a name the API server refuses, and an empty one it
		// takes (the slice must then carry none, as it refuses "" there).
		"apiVersion: v1\nkind: Endpoints\nmetadata: {name: web}\nsubsets: [{addresses: [{ip: 10.1.0.1, nodeName: nodT}], ports: [{port: 80}]}]\n",
		"apiVersion: v1\nkind: Endpoints\nmetadata: {name: web}\nsubsets: [{addresses: [{ip: 10.1.0.1, nodeName: \"\"}], ports: [{port: 80}]}]\n",
	} {
		f.Add([]byte(seed))
	}
	svc := types.NamespacedName{Namespace: "default", Name: "web"}
	f.Fuzz(func(t *testing.T, data []byte) {
		ms, _ := config.DecodeManifests("in.yaml", data)
		for _, m := range ms {
			switch o := m.Object.(type) {
			case *v1.Endpoints:
				for _, es := range checkEndpointsToSlices(t, o) {
					checkSliceEndpoints(t, es, true)
				}
			case *discovery.EndpointSlice:
				checkSliceEndpoints(t, o, true)
			}
		}
		// The informer path: whatever the API server stored, unvalidated.
		var es discovery.EndpointSlice
		if yaml.Unmarshal(data, &es) == nil {
			checkSliceEndpoints(t, &es, false)
			es.Namespace = svc.Namespace
			for _, policy := range []trafficPolicy{{}, {internalLocal: true, hasExternal: true}, {externalLocal: true, hasExternal: true}} {
				tr := newEndpointsTracker(loadbalancer.New(clock.RealClock{}, loadbalancer.Limits{}), clock.RealClock{}, NewMetrics(), nodeTopology{name: "node", zone: "a"})
				tr.setPolicy(svc, policy, true)
				tr.update(&es, false)
				tr.update(&es, true)
			}
		}
	})
}

// checkEndpointsToSlices converts a valid Endpoints and checks the slices.
func checkEndpointsToSlices(t *testing.T, e *v1.Endpoints) []*discovery.EndpointSlice {
	t.Helper()
	slices := config.EndpointsToSlices(e)
	// One the mirroring controller leaves alone has no slices, as there
	// (a label asking it to, a leader-election lock).
	if _, lock := e.Annotations["control-plane.alpha.kubernetes.io/leader"]; lock || e.Labels[discovery.LabelSkipMirror] == "true" {
		if len(slices) != 0 {
			t.Fatalf("Endpoints the mirroring controller skips converted into %d slices", len(slices))
		}
		return nil
	}
	want := 0
	for _, ss := range e.Subsets {
		want += len(ss.Addresses) + len(ss.NotReadyAddresses)
	}
	got := 0
	names := map[string]bool{}
	for _, es := range slices {
		got += len(es.Endpoints)
		if names[es.Name] {
			t.Fatalf("two slices named %s", es.Name)
		}
		names[es.Name] = true
		text, err := yaml.Marshal(es)
		if err != nil {
			t.Fatal(err)
		}
		again, errs := config.DecodeManifests("converted.yaml", text)
		if len(errs) > 0 || len(again) != 1 {
			t.Fatalf("converted slice is not a valid manifest: %v\n%s", errs, text)
		}
	}
	if got != want {
		t.Fatalf("Endpoints with %d addresses converted into %d endpoints", want, got)
	}
	return slices
}

// checkSliceEndpoints checks what the tracker would hand the balancer.
func checkSliceEndpoints(t *testing.T, es *discovery.EndpointSlice, valid bool) {
	t.Helper()
	svc := types.NamespacedName{Namespace: es.Namespace, Name: "web"}
	byPort := endpointsByPort(svc, map[string]*discovery.EndpointSlice{es.Name: es})
	// Read as the proxier reads a cluster object's addresses: leading
	// zeros an older API server stored ("00.0.0.0") are decimal, as
	// kube-proxy's ParseIPSloppy reads them (netip.ParseAddr refused them,
	// and the check called the endpoint 0.0.0.0:1 not the slice's).
	addrs := map[netip.Addr]bool{}
	for _, ep := range es.Endpoints {
		for _, a := range ep.Addresses {
			if ip, ok := config.ParseObjectIP(a); ok {
				addrs[ip] = true
			}
		}
	}
	total := 0
	for spn, eps := range byPort {
		total += len(eps)
		for _, e := range eps {
			if !e.Addr.Addr().IsValid() || e.Addr.Addr().Zone() != "" || e.Addr.Addr().Is4In6() || !addrs[e.Addr.Addr()] {
				t.Fatalf("%s: endpoint %v is not a plain IP of the slice", spn, e.Addr)
			}
			if !slicePortHas(es, spn, int32(e.Addr.Port())) || e.Addr.Port() == 0 {
				t.Fatalf("%s: endpoint %v has a port the slice does not give", spn, e.Addr)
			}
		}
	}
	if !valid {
		return
	}
	want := 0
	for _, p := range es.Ports {
		if p.Port == nil {
			continue
		}
		for _, ep := range es.Endpoints {
			if len(ep.Addresses) > 0 {
				want++ // the first address only: they are fungible
			}
		}
	}
	if total != want {
		t.Fatalf("valid slice %s: %d endpoints, want %d (ports × endpoints)", es.Name, total, want)
	}
}

func slicePortHas(es *discovery.EndpointSlice, spn loadbalancer.ServicePortName, port int32) bool {
	for _, p := range es.Ports {
		name, proto := "", v1.ProtocolTCP
		if p.Name != nil {
			name = *p.Name
		}
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if name == spn.Port && proto == spn.Protocol && p.Port != nil && *p.Port == port {
			return true
		}
	}
	return false
}
