package config

//lint:file-ignore SA1019 v1.Endpoints is read on purpose: manifests may hold them, and they are converted to EndpointSlices

import (
	"maps"
	"os"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

func TestEndpointsToSlices(t *testing.T) {
	got, errs := DecodeManifests("ep.yaml", []byte(endpointsYAML))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	slices := EndpointsToSlices(got[0].Object.(*v1.Endpoints))
	type ep struct {
		addr  string
		ready bool
	}
	want := []struct {
		name   string
		family discovery.AddressType
		eps    []ep
	}{
		{"web-subset0-ipv4", discovery.AddressTypeIPv4, []ep{{"10.1.0.1", true}, {"10.1.0.9", false}}},
		{"web-subset0-ipv6", discovery.AddressTypeIPv6, []ep{{"fd00::1", true}}},
	}
	if len(slices) != len(want) {
		t.Fatalf("got %d slices, want %d", len(slices), len(want))
	}
	for i, w := range want {
		s := slices[i]
		if s.Name != w.name || s.Namespace != "default" || s.AddressType != w.family ||
			s.Labels[discovery.LabelServiceName] != "web" {
			t.Errorf("slice %d: got %s/%s %s labels %v", i, s.Namespace, s.Name, s.AddressType, s.Labels)
		}
		if len(s.Ports) != 1 || *s.Ports[0].Port != 8080 || *s.Ports[0].Protocol != v1.ProtocolTCP || *s.Ports[0].Name != "" {
			t.Errorf("slice %d: ports %+v", i, s.Ports)
		}
		if len(s.Endpoints) != len(w.eps) {
			t.Fatalf("slice %d: %d endpoints, want %d", i, len(s.Endpoints), len(w.eps))
		}
		for j, e := range w.eps {
			got := s.Endpoints[j]
			if got.Addresses[0] != e.addr || *got.Conditions.Ready != e.ready || *got.Conditions.Serving != e.ready || *got.Conditions.Terminating {
				t.Errorf("slice %d endpoint %d: got %v %+v, want %s ready=%v", i, j, got.Addresses, got.Conditions, e.addr, e.ready)
			}
		}
		if err := validate(s, DefaultNodePortRange); err != nil {
			t.Errorf("converted slice is invalid: %v", err)
		}
	}
}

func TestExampleManifestsAreValid(t *testing.T) {
	names, _, _, err := (&ManifestSource{path: "../../examples/manifests", dirMode: true}).listFiles()
	if err != nil || len(names) < 4 {
		t.Fatalf("examples: %v %v", names, err)
	}
	faultNames, _, _, err := (&ManifestSource{path: "../../examples/faults", dirMode: true}).listFiles()
	if err != nil || len(faultNames) < 1 {
		t.Fatalf("examples/faults: %v %v", faultNames, err)
	}
	names = append(names, faultNames...)
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		ms, errs := DecodeManifests(n, data)
		if len(errs) > 0 || len(ms) == 0 {
			t.Errorf("%s: %d objects, errors %v", n, len(ms), errs)
		}
	}
}

// An Endpoints labelled endpointslice.kubernetes.io/skip-mirror=true is
// one the mirroring controller leaves alone, so no slice of it reaches
// kube-proxy; converted anyway, its addresses were served (beside a
// hand-written slice's, a stale one's).
func TestEndpointsSkipMirrorIsNotConverted(t *testing.T) {
	got, errs := DecodeManifests("ep.yaml", []byte(endpointsYAML))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	e := got[0].Object.(*v1.Endpoints)
	e.Labels = map[string]string{discovery.LabelSkipMirror: "true"}
	if slices := EndpointsToSlices(e); len(slices) != 0 {
		t.Errorf("skip-mirror Endpoints converted to %d slices, want none", len(slices))
	}
	e.Labels[discovery.LabelSkipMirror] = "false"
	if slices := EndpointsToSlices(e); len(slices) == 0 {
		t.Error("skip-mirror=false Endpoints not converted")
	}
}

// Slices converted from an Endpoints carry its labels and annotations, as
// the mirroring controller's do (it sets the service-name and managed-by
// labels itself and leaves out the trigger-time and last-applied
// annotations), so that ProxyLabelSelector leaves out what kube-proxy
// would: the slices of an Endpoints labelled for another proxy or
// headless were served.
func TestEndpointsToSlicesCopyMetadata(t *testing.T) {
	own := map[string]string{discovery.LabelServiceName: "web", discovery.LabelManagedBy: ManagedByManifests}
	with := func(m map[string]string) map[string]string {
		out := maps.Clone(own)
		maps.Copy(out, m)
		return out
	}
	for _, tc := range []struct {
		name                  string
		labels, annotations   map[string]string
		wantLabels, wantAnnot map[string]string
		served                bool
	}{
		{name: "none", wantLabels: own, served: true},
		{name: "plain labels", labels: map[string]string{"app": "web"},
			wantLabels: with(map[string]string{"app": "web"}), served: true},
		{name: "another proxy's", labels: map[string]string{"service.kubernetes.io/service-proxy-name": "other"},
			wantLabels: with(map[string]string{"service.kubernetes.io/service-proxy-name": "other"})},
		{name: "headless", labels: map[string]string{"service.kubernetes.io/headless": ""},
			wantLabels: with(map[string]string{"service.kubernetes.io/headless": ""})},
		{name: "own labels overwritten", labels: map[string]string{discovery.LabelServiceName: "api", discovery.LabelManagedBy: "someone"},
			wantLabels: own, served: true},
		{name: "annotations", annotations: map[string]string{"note": "x", v1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z",
			v1.LastAppliedConfigAnnotation: "{}"},
			wantLabels: own, wantAnnot: map[string]string{"note": "x"}, served: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := DecodeManifests("ep.yaml", []byte(endpointsYAML))
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			e := got[0].Object.(*v1.Endpoints)
			e.Labels, e.Annotations = tc.labels, tc.annotations
			slices := EndpointsToSlices(e)
			if len(slices) == 0 {
				t.Fatal("no slice")
			}
			for _, s := range slices {
				if !maps.Equal(s.Labels, tc.wantLabels) || !maps.Equal(s.Annotations, tc.wantAnnot) {
					t.Errorf("%s: labels %v, annotations %v; want %v, %v", s.Name, s.Labels, s.Annotations, tc.wantLabels, tc.wantAnnot)
				}
			}
			served := deliverables("ep.yaml", 0, objectKey{"Endpoints", e.Namespace, e.Name}, e)
			if (len(served) > 0) != tc.served {
				t.Errorf("%d slices served, want served=%v", len(served), tc.served)
			}
			if e.Labels != nil {
				e.Labels["later"] = "edit"
				if !maps.Equal(slices[0].Labels, tc.wantLabels) {
					t.Errorf("labels %v once the Endpoints' changed, want %v: the maps are shared", slices[0].Labels, tc.wantLabels)
				}
			}
		})
	}
}

// An Endpoints that holds a leader-election record (the annotation client-go's
// Endpoints lock wrote) is a lock, not a set of backends: the mirroring
// controller skips it.
func TestEndpointsLeaderElectionLockIsNotConverted(t *testing.T) {
	got, errs := DecodeManifests("ep.yaml", []byte(endpointsYAML))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	e := got[0].Object.(*v1.Endpoints)
	e.Annotations = map[string]string{"control-plane.alpha.kubernetes.io/leader": `{"holderIdentity":"a"}`}
	if slices := EndpointsToSlices(e); len(slices) != 0 {
		t.Errorf("a leader-election Endpoints converted to %d slices, want none", len(slices))
	}
}
