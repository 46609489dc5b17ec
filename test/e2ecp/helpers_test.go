package e2ecp

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// These tests need neither root nor a control plane: they pin down the helpers the
// end-to-end checks rely on.

func TestReadRBAC(t *testing.T) {
	objs, err := readRBAC(deployRBAC)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.serviceAccounts) != 1 || len(objs.roles) != 1 || len(objs.bindings) != 1 {
		t.Fatalf("want one ServiceAccount, ClusterRole and binding, got %d, %d, %d",
			len(objs.serviceAccounts), len(objs.roles), len(objs.bindings))
	}
	sa := objs.serviceAccounts[0]
	if got := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name; got != "system:serviceaccount:kube-system:kube-userspace-proxy" {
		t.Errorf("service account %s: not the identity the control plane's proxy token has", got)
	}
	b := objs.bindings[0]
	if b.RoleRef.Name != objs.roles[0].Name || len(b.Subjects) != 1 || b.Subjects[0].Name != sa.Name {
		t.Errorf("binding %s does not bind role %s to %s: %+v", b.Name, objs.roles[0].Name, sa.Name, b)
	}
}

func TestReadRBACRejects(t *testing.T) {
	tests := []struct{ name, yaml string }{
		{"unknown kind", "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n"},
		{"unknown field", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\nbogus: 1\n"},
		{"not yaml", "kind: [\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rbac.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := readRBAC(path); err == nil {
				t.Error("no error")
			}
		})
	}
}

func TestEndpointSliceConditions(t *testing.T) {
	a, b := netip.MustParseAddr("10.77.1.100"), netip.MustParseAddr("10.77.1.120")
	tests := []struct {
		name string
		eps  []endpoint
		// want is, per endpoint, address and ready/serving/terminating.
		want []string
	}{
		{"ready", readyEndpoints(a), []string{"10.77.1.100 true true false"}},
		{"surge", append(readyEndpoints(a), endpoint{b, ready}),
			[]string{"10.77.1.100 true true false", "10.77.1.120 true true false"}},
		{"old terminating", markTerminating(append(readyEndpoints(a), endpoint{b, ready}), a),
			[]string{"10.77.1.100 false true true", "10.77.1.120 true true false"}},
		{"old removed", without(markTerminating(readyEndpoints(a, b), a), a),
			[]string{"10.77.1.120 true true false"}},
	}
	svc := newService("ns", "svc", 80, 53)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newEndpointSlice(svc, tt.eps)
			var got []string
			for _, ep := range s.Endpoints {
				c := ep.Conditions
				got = append(got, ep.Addresses[0]+" "+fmtBool(c.Ready)+" "+fmtBool(c.Serving)+" "+fmtBool(c.Terminating))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("endpoints %q, want %q", got, tt.want)
			}
			if s.Labels["kubernetes.io/service-name"] != "svc" || len(s.Ports) != 2 {
				t.Errorf("slice not tied to its Service: labels %v, ports %d", s.Labels, len(s.Ports))
			}
		})
	}
}

func fmtBool(b *bool) string {
	if b == nil {
		return "nil"
	}
	if *b {
		return "true"
	}
	return "false"
}

func TestServicePortsMatchSlicePorts(t *testing.T) {
	svc := newService("ns", "svc", 80, 53)
	s := newEndpointSlice(svc, nil)
	for i, p := range svc.Spec.Ports {
		sp := s.Ports[i]
		if *sp.Name != p.Name || *sp.Protocol != p.Protocol || *sp.Port != p.TargetPort.IntVal {
			t.Errorf("Service port %s/%s→%d has slice port %s/%s/%d", p.Name, p.Protocol, p.TargetPort.IntVal, *sp.Name, *sp.Protocol, *sp.Port)
		}
	}
	if svc.Spec.Ports[1].Protocol != v1.ProtocolUDP {
		t.Error("second port is not UDP")
	}
}

func TestParseConntrackStats(t *testing.T) {
	text := "entries  clashres found new invalid insert_failed drop\n" +
		"00000002  00000000 00000000 00000000 0000000a 00000001 00000000\n" +
		"00000003  00000000 00000000 00000000 00000005 00000000 00000002\n"
	got, err := parseConntrackStats(text)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"entries": 5, "invalid": 15, "insert_failed": 1, "drop": 2}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d", k, got[k], v)
		}
	}
	if _, err := parseConntrackStats("entries invalid\nzz 1\n"); err == nil {
		t.Error("bad hex accepted")
	}
}

func TestIsUnNATed(t *testing.T) {
	dst := netip.MustParseAddrPort("10.96.1.1:80")
	tests := []struct {
		name, line string
		want       bool
	}{
		{"pre-rule SYN", "ipv4     2 tcp      6 117 SYN_SENT src=10.77.11.9 dst=10.96.1.1 sport=40000 dport=80 [UNREPLIED] src=10.96.1.1 dst=10.77.11.9 sport=80 dport=40000 mark=0 zone=0 use=2", true},
		{"redirected", "ipv4     2 tcp      6 60 TIME_WAIT src=10.77.11.9 dst=10.96.1.1 sport=40001 dport=80 src=10.77.11.1 dst=10.77.11.9 sport=33981 dport=40001 [ASSURED] mark=0 zone=0 use=2", false},
		{"other port", "ipv4     2 tcp      6 117 SYN_SENT src=10.77.11.9 dst=10.96.1.1 sport=40000 dport=81 [UNREPLIED] src=10.96.1.1 dst=10.77.11.9 sport=81 dport=40000 mark=0 zone=0 use=2", false},
		{"udp", "ipv4     2 udp      17 29 src=10.77.11.9 dst=10.96.1.1 sport=40000 dport=80 [UNREPLIED] src=10.96.1.1 dst=10.77.11.9 sport=80 dport=40000 mark=0 zone=0 use=2", false},
		{"short", "ipv4 2 tcp", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isUnNATed(tt.line, dst); got != tt.want {
				t.Errorf("isUnNATed = %v, want %v", got, tt.want)
			}
		})
	}
}
