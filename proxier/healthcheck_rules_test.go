package proxier

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// healthCheckAccepts is the rules of KUBE-NODEPORT-NON-LOCAL that accept a
// healthCheckNodePort.
func healthCheckAccepts(f *iptables.FakeRunner) []string {
	var out []string
	for _, r := range f.Rules(iptables.TableFilter, iptables.ChainNodePortNonLocal) {
		if strings.Contains(r, " health check node port\"") {
			out = append(out, r)
		}
	}
	return out
}

// A healthCheckNodePort is accepted in filter, where a node whose INPUT
// policy drops (ufw, firewalld) dropped a load balancer's health checks
// while the Service's NodePort on the same node answered: the health
// server listens on the node port itself, with no portal whose proxy port
// KUBE-NODEPORT-NON-LOCAL accepts. One rule per Service port, in each family
// of the Service, as kube-proxy's KUBE-NODEPORTS; it follows the Service
// through Updates (a new port, externalTrafficPolicy Cluster, deletion) and
// a full sync keeps it.
func TestHealthCheckNodePortAccepted(t *testing.T) {
	fake4, fake6 := iptables.NewFakeRunner(iptables.IPv4), iptables.NewFakeRunner(iptables.IPv6)
	p := newTestProxier(t, Options{
		IPv4Portals:   iptables.New(fake4, iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.0.2.2")}),
		IPv6Portals:   iptables.New(fake6, iptables.Config{Family: iptables.IPv6, NodeIP: mustAddr("2001:db8::2")}),
		BindAddress:   mustAddr("0.0.0.0"),
		ServiceHealth: &healthRecorder{},
		NodeName:      "node1",
	})
	accept := func(port int) []string {
		return []string{`-p tcp -m comment --comment "default/web:p health check node port" -m tcp --dport ` + strconv.Itoa(port) + ` -m conntrack --ctstate NEW -j ACCEPT`}
	}
	cluster := localLB("web", 0)
	cluster.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	dual := localLB("web", 31002)
	dual.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
	dual.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	var last *v1.Service
	steps := []struct {
		what         string
		svc          *v1.Service // nil: deleted
		want4, want6 []string
	}{
		{"LoadBalancer, externalTrafficPolicy Local", localLB("web", 31000), accept(31000), nil},
		{"healthCheckNodePort changed", localLB("web", 31001), accept(31001), nil},
		{"externalTrafficPolicy Cluster", cluster, nil, nil},
		{"Local again, dual-stack", dual, accept(31002), accept(31002)},
		{"Service deleted", nil, nil, nil},
	}
	for _, st := range steps {
		switch {
		case st.svc == nil:
			p.OnServiceDelete(last)
		case last == nil:
			p.OnServiceAdd(st.svc)
		default:
			p.OnServiceUpdate(last, st.svc)
		}
		last = st.svc
		for _, full := range []bool{false, true} {
			p.repairAsked.Store(full) // the first sync is full anyway; Update after it
			p.Sync()
			if got := healthCheckAccepts(fake4); !slices.Equal(got, st.want4) {
				t.Errorf("%s (full sync %v): IPv4 health check accepts %q, want %q", st.what, full, got, st.want4)
			}
			if got := healthCheckAccepts(fake6); !slices.Equal(got, st.want6) {
				t.Errorf("%s (full sync %v): IPv6 health check accepts %q, want %q", st.what, full, got, st.want6)
			}
		}
	}
}
