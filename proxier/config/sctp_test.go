package config

import (
	"bytes"
	"flag"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

func TestSCTPPorts(t *testing.T) {
	withPorts := func(ports ...v1.ServicePort) *v1.Service {
		return svc("web", func(s *v1.Service) { s.Spec.Ports = ports })
	}
	tcp := v1.ServicePort{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}
	sctp := v1.ServicePort{Name: "sig", Port: 3868, Protocol: v1.ProtocolSCTP}
	sctp2 := v1.ServicePort{Name: "sig2", Port: 2905, Protocol: v1.ProtocolSCTP}
	for _, tc := range []struct {
		name     string
		old, svc *v1.Service
		want     []string
	}{
		{"none", nil, withPorts(tcp), nil},
		{"added", nil, withPorts(tcp, sctp), []string{"sig 3868/SCTP"}},
		{"unnamed", nil, withPorts(v1.ServicePort{Port: 9, Protocol: v1.ProtocolSCTP}), []string{`"" 9/SCTP`}},
		{"unchanged (a resync)", withPorts(tcp, sctp), withPorts(tcp, sctp), nil},
		{"one more", withPorts(tcp, sctp), withPorts(tcp, sctp, sctp2), []string{"sig2 2905/SCTP"}},
		{"was TCP", withPorts(v1.ServicePort{Name: "sig", Port: 3868, Protocol: v1.ProtocolTCP}), withPorts(sctp), []string{"sig 3868/SCTP"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sctpPorts(tc.old, tc.svc); !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// captureKlog sends klog's output to a buffer until the test ends.
func captureKlog(t *testing.T) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("v", "0")
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		klog.SetOutput(nil)
		klog.LogToStderr(true)
	})
	return &buf
}

// TestSCTPSkippedByBothSources: a Service with an SCTP port is delivered by
// either source, and the skipped port is logged once, not on a resync.
func TestSCTPSkippedByBothSources(t *testing.T) {
	const manifest = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.10\n" +
		"  ports: [{name: http, port: 80}, {name: sig, port: 3868, protocol: SCTP}]\n"
	ms, errs := DecodeManifests("svc.yaml", []byte(manifest))
	if len(errs) > 0 || len(ms) != 1 {
		t.Fatalf("decode: %d objects, errors %v", len(ms), errs)
	}
	s := ms[0].Object.(*v1.Service)
	const line = `"Warning: SCTP ports are skipped (the userspace proxy carries TCP and UDP); the Service's other ports are served" service="default/web" ports=["sig 3868/SCTP"]`

	sources := map[string]func(h Handler, old, cur *v1.Service){
		"manifests": func(h Handler, old, cur *v1.Service) {
			e := event{cur: &servedObject{obj: cur}}
			if old != nil {
				e.old = &servedObject{obj: old}
			}
			deliver(h, e)
		},
		"API server": func(h Handler, old, cur *v1.Service) {
			e := serviceEvents{s: NewInformerSource(nil, h, InformerOptions{})}
			if old == nil {
				e.OnAdd(cur, false)
			} else {
				e.OnUpdate(old, cur)
			}
			e.s.deliverCalls(e.s.takeCalls()) // no Run: deliver what was handed over
		},
	}
	for name, feed := range sources {
		t.Run(name, func(t *testing.T) {
			logs := captureKlog(t)
			rec := newManifestRecorder()
			feed(rec, nil, s)
			feed(rec, s, s.DeepCopy())
			klog.Flush()
			if got := rec.take(); !slices.Equal(got, []string{"add Service default/web", "update Service default/web"}) {
				t.Errorf("events %q", got)
			}
			if n := strings.Count(logs.String(), line); n != 1 {
				t.Errorf("%d lines %s, want one; log:\n%s", n, line, logs)
			}
		})
	}
}

// A Service whose every port is SCTP is said to be not served: "its other
// ports are served" claimed some (API-server audit).
func TestSCTPOnlyServiceSaidNotServed(t *testing.T) {
	logs := captureKlog(t)
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sig"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "a", Port: 3868, Protocol: v1.ProtocolSCTP}}}}
	logSCTPPorts(nil, svc)
	klog.Flush()
	if !strings.Contains(logs.String(), "the Service has no other port, so it is not served") || strings.Contains(logs.String(), "other ports are served") {
		t.Errorf("log: %s", logs)
	}
}

// TestUnusableServiceIPsLogged: the API-server source says once per change
// that brings one which ClusterIPs and LoadBalancer ingress IPs are not
// programmed (loopback, link-local, unspecified), not on a resync.
func TestUnusableServiceIPsLogged(t *testing.T) {
	logs := captureKlog(t)
	s := svc("lb", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.7.7", []string{"10.96.7.7"}
		s.Spec.Ports = []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30111}}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "127.0.0.1"}, {IP: "198.51.100.1"}, {IP: "169.254.169.254"}}
	})
	rec := newManifestRecorder()
	e := serviceEvents{s: NewInformerSource(nil, rec, InformerOptions{})}
	e.OnAdd(s, false)
	again := s.DeepCopy()
	again.ResourceVersion = "2"
	e.OnUpdate(s, again)
	e.s.deliverCalls(e.s.takeCalls())
	klog.Flush()
	if got := rec.take(); !slices.Equal(got, []string{"add Service default/lb", "update Service default/lb"}) {
		t.Errorf("events %q", got)
	}
	const line = `addresses=["status.loadBalancer.ingress[0].ip 127.0.0.1: must not be in the loopback range (127.0.0.0/8, ::1/128)","status.loadBalancer.ingress[2].ip 169.254.169.254: must not be in the link-local range (169.254.0.0/16, fe80::/10)"]`
	if n := strings.Count(logs.String(), line); n != 1 {
		t.Errorf("%d lines with %s, want one; log:\n%s", n, line, logs)
	}
}
