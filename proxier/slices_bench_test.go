package proxier_test

import (
	"fmt"
	"net/netip"
	"testing"

	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// oneEndpointSlice is slice i of benchService(0), with one ready endpoint:
// what a hand-made manifest or a third-party slice controller may give
// (the API server's controller packs 100 endpoints per slice).
func oneEndpointSlice(i int) *discovery.EndpointSlice {
	name, port := "http", int32(8080)
	ready := true
	addr := netip.AddrFrom4([4]byte{10, byte(100 + i>>16), byte(i >> 8), byte(i)})
	return &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: benchNamespace,
			Name:      fmt.Sprintf("svc-0-%d", i),
			Labels:    map[string]string{discovery.LabelServiceName: "svc-0"},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Port: &port}},
		Endpoints: []discovery.Endpoint{{
			Addresses:  []string{addr.String()},
			Conditions: discovery.EndpointConditions{Ready: &ready},
		}},
	}
}

// BenchmarkManySlicesOneService is the start of a proxy given one Service
// whose endpoints come in n one-endpoint EndpointSlices, delivered one by
// one in one batch, as the sources deliver a manifest reload or an
// informer's initial list, then the first sync. Merging every
// slice of the Service again at each slice made this quadratic in n: 4.4 s
// of CPU at 2,500 slices, hours at 100,000.
func BenchmarkManySlicesOneService(b *testing.B) {
	quietKlog()
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("slices=%d", n), func(b *testing.B) {
			all := make([]*discovery.EndpointSlice, n)
			for i := range all {
				all[i] = oneEndpointSlice(i)
			}
			b.ReportAllocs()
			var cpu cpuMeter
			defer cpu.report(b)
			for b.Loop() {
				b.StopTimer()
				p := newBenchProxier(b, proxier.DataPathGoroutines)
				b.StartTimer()
				cpu.start()
				p.BeginBatch()
				p.OnServiceAdd(benchService(0))
				for _, es := range all {
					p.OnEndpointSliceAdd(es)
				}
				p.EndBatch()
				p.OnServiceSynced()
				p.OnEndpointSlicesSynced()
				p.Sync()
				cpu.stop()
				b.StopTimer()
				if got := servedEndpoints(p, benchNamespace+"/svc-0:http"); got != n {
					b.Fatalf("svc-0:http serves %d endpoints, want %d", got, n)
				}
				stopBenchProxier(p)
				b.StartTimer()
			}
		})
	}
}

// servedEndpoints is how many endpoints the service port named name
// (namespace/service:port) has in /debug/services; -1 when it has no row.
func servedEndpoints(p *proxier.Proxier, name string) int {
	for _, d := range p.DebugServices() {
		if d.ServicePort == name {
			return len(d.Endpoints)
		}
	}
	return -1
}
