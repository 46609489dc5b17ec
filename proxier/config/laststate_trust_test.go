package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// A state file another user could have written is not read: one owned by
// uid 1001 in a world-writable directory was served after the grace,
// a loopback externalIP included. Like ssh with keys, the file must be the
// proxy's uid's and writable by no one else (WriteStateFile makes it 0600).
func TestStateFileUntrusted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    os.FileMode
		uid     int // -1: the test's own
		wantErr string
	}{
		{"the proxy's, 0600", 0o600, -1, ""},
		{"the proxy's, 0644", 0o644, -1, ""},
		{"writable by others", 0o606, -1, "writable by group or others (mode 0606)"},
		{"writable by the group", 0o620, -1, "writable by group or others (mode 0620)"},
		{"another user's", 0o600, 1001, "owned by uid 1001, not"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.json")
			if err := WriteStateFile(path, State{Written: time.Now(), Node: "node-a", Zone: "z",
				Services: []*v1.Service{stateService("web", "10.96.0.10")}}); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			if tc.uid >= 0 {
				if os.Geteuid() != 0 {
					t.Skip("chown needs root")
				}
				if err := os.Chown(path, tc.uid, tc.uid); err != nil {
					t.Fatal(err)
				}
			}
			st, err := ReadStateFile(path)
			_, _, nodeErr := ReadStateNode(path)
			if tc.wantErr == "" {
				if err != nil || nodeErr != nil || len(st.Services) != 1 {
					t.Errorf("ReadStateFile: %d Services, %v; ReadStateNode: %v", len(st.Services), err, nodeErr)
				}
				return
			}
			for fn, err := range map[string]error{"ReadStateFile": err, "ReadStateNode": nodeErr} {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "not trusted") {
					t.Errorf("%s: error %v, want it to say %q and not trusted", fn, err, tc.wantErr)
				}
			}
		})
	}
}

// The file's objects pass the manifests' validation before they are
// served: a loopback externalIP (which took over 127.0.0.1:80 on the node)
// or an endpoint that is no address is left out, and said so. What the
// API server accepts is kept: a Service whose faults annotation does not
// parse is served without faults from the informers, and so from the file.
func TestStateFileInvalidObjectsLeftOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	loopback := stateService("forged", "10.96.0.11")
	loopback.Spec.ExternalIPs = []string{"127.0.0.1"}
	badFaults := stateService("faulty", "10.96.0.12")
	badFaults.Annotations = map[string]string{faults.Annotation: "latency please"}
	badSlice := stateSlice("web", "web-2", "not-an-ip")
	writeState(t, path, []*v1.Service{stateService("web", "10.96.0.10"), loopback, badFaults},
		[]*discovery.EndpointSlice{stateSlice("web", "web-1", "10.1.0.5"), badSlice})

	st, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range st.Services {
		got = append(got, s.Name)
	}
	for _, es := range st.EndpointSlices {
		got = append(got, es.Name)
	}
	if want := "[faulty web web-1]"; fmtList(got) != want {
		t.Errorf("read %v, want %s", got, want)
	}
	var skipped []string
	for _, e := range st.Skipped {
		skipped = append(skipped, e.Error())
	}
	all := strings.Join(skipped, "\n")
	if len(skipped) != 2 || !strings.Contains(all, `Service default/forged: spec.externalIPs[0]: "127.0.0.1" must not be in the loopback range`) ||
		!strings.Contains(all, `EndpointSlice default/web-2: endpoints[0].addresses[0]: "not-an-ip" is not a valid IP address`) {
		t.Errorf("skipped:\n%s", all)
	}
}

// A Service the API server accepts, and the informers' path
// serves (its ClusterIP and NodePort; only the ingress IP gets no portal),
// must not vanish from the last known state: validated as a manifest, it
// was left out, and after a restart while the API server was down
// neither its ClusterIP nor its NodePort was served.
func TestStateFileKeepsServiceWithUnusableIngressIP(t *testing.T) {
	for _, ing := range []string{"127.0.0.1", "169.254.10.1"} {
		svc := stateService("lb", "10.96.0.20")
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Spec.Ports[0].NodePort = 30080
		svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ing}}
		path := filepath.Join(t.TempDir(), "state.json")
		if err := WriteStateFile(path, State{Written: time.Now(), Node: "node-a",
			Services: []*v1.Service{svc, stateService("web", "10.96.0.10")}}); err != nil {
			t.Fatal(err)
		}
		st, err := ReadStateFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range st.Services {
			names = append(names, s.Name)
		}
		if len(st.Services) != 2 {
			t.Errorf("ingress %s: state served %v, skipped %v; want the LoadBalancer Service kept (ClusterIP 10.96.0.20, NodePort 30080), as the informers serve it", ing, names, st.Skipped)
		}
	}
}

// IPv4-mapped addresses are refused in manifests as the API server's
// strict IP validation (1.36+) refuses them, but an older API server, or an
// object from before, gives them and the informers serve them (unmapped):
// the last known state must keep such objects (the IPv4 slice's address
// was left out as "not an IPv4 address").
func TestStateFileKeepsIPv4MappedAddresses(t *testing.T) {
	svc := stateService("web", "10.96.0.10")
	svc.Spec.ExternalIPs = []string{"::ffff:192.0.2.10"}
	stateFileKeeps(t, svc, stateSlice("web", "web-1", "::ffff:10.1.0.1"))
}

// stateFileKeeps writes svc and es to a state file and checks that
// reading it keeps both.
func stateFileKeeps(t *testing.T, svc *v1.Service, es *discovery.EndpointSlice) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.json")
	if err := WriteStateFile(path, State{Written: time.Now(), Node: "node-a", Services: []*v1.Service{svc},
		EndpointSlices: []*discovery.EndpointSlice{es}}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Services) != 1 || len(st.EndpointSlices) != 1 {
		t.Errorf("state kept %d Services, %d slices, skipped %v; want both kept, as the informers serve them", len(st.Services), len(st.EndpointSlices), st.Skipped)
	}
}

// The manifests refuse an ipMode or trafficDistribution they do not know, as
// today's API server does, but a later API server may give new values, and
// the informers serve such a Service (an unknown ipMode's IP without a
// portal): the last known state must keep it.
func TestStateFileKeepsUnknownEnumValues(t *testing.T) {
	svc := stateService("lb", "10.96.0.20")
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.Ports[0].NodePort = 30080
	mode := v1.LoadBalancerIPMode("Tunnel")
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.1", IPMode: &mode}}
	dist := "PreferSameRack"
	svc.Spec.TrafficDistribution = &dist
	path := filepath.Join(t.TempDir(), "state.json")
	if err := WriteStateFile(path, State{Written: time.Now(), Node: "node-a", Services: []*v1.Service{svc}}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Services) != 1 {
		t.Errorf("state kept %d Services, skipped %v; want the Service kept, as the informers serve it", len(st.Services), st.Skipped)
	}
}
