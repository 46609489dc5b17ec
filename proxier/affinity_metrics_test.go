package proxier

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// TestAffinityCapThroughProxySocket: three clients (127.0.0.2-4) connect to
// a ClientIP Service whose table holds two; the third evicts the first, and
// /metrics reports two entries and one eviction for the port.
func TestAffinityCapThroughProxySocket(t *testing.T) {
	backends := startBackends(t, "127.0.0.1", "127.0.0.2")
	p := newTestProxier(t, Options{Affinity: loadbalancer.Limits{MaxAffinityEntries: 2}})
	p.OnServiceAdd(makeService("sticky", withClientIPAffinity(3600)))
	p.OnEndpointSliceAdd(makeSlice("sticky", v1.ProtocolTCP,
		backends[0].ln.Addr().String(), "127.0.0.2:"+portOf(backends[0].ln.Addr())))
	p.Sync()
	addr := proxyAddr(t, p, "default/sticky:p")
	for _, src := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		if _, err := askName(t, src, addr); err != nil {
			t.Fatalf("from %s: %v", src, err)
		}
	}
	want := `
# HELP kubeproxy_userspace_affinity_entries ClientIP affinity entries held per service port
# TYPE kubeproxy_userspace_affinity_entries gauge
kubeproxy_userspace_affinity_entries{service_port="default/sticky:p"} 2
# HELP kubeproxy_userspace_affinity_entries_evicted_total ClientIP affinity entries evicted (least recently used first) because the table was at --affinity-max-entries-per-port
# TYPE kubeproxy_userspace_affinity_entries_evicted_total counter
kubeproxy_userspace_affinity_entries_evicted_total{service_port="default/sticky:p"} 1
`
	if err := testutil.GatherAndCompare(p.metrics.Registry, strings.NewReader(want),
		"kubeproxy_userspace_affinity_entries", "kubeproxy_userspace_affinity_entries_evicted_total"); err != nil {
		t.Error(err)
	}
	var clients []string
	var evicted uint64
	for _, row := range p.DebugServices() {
		for _, c := range row.Clients {
			clients = append(clients, c.ClientIP)
		}
		evicted += row.AffinityEvicted
	}
	if evicted != 1 {
		t.Errorf("/debug/services affinityEvicted %d, want 1", evicted)
	}
	if strings.Join(clients, ",") != "127.0.0.3,127.0.0.4" {
		t.Errorf("/debug/services affinity clients %v, want 127.0.0.3 and 127.0.0.4 (127.0.0.2 evicted)", clients)
	}
}
