package proxier_test

import (
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// benchIdlePorts is how many service ports BenchmarkIdleServicePorts opens.
const benchIdlePorts = 1000

// BenchmarkIdleServicePorts opens benchIdlePorts service ports of one
// protocol that have never seen a datagram or connection (loopback
// listeners, the fake iptables runner) and reports what one such port
// keeps in the Go heap after a collection: HeapInuse (heap-B/port) and
// HeapAlloc (live-B/port, what the GC counts towards its next goal), and
// goroutine stacks (stack-B/port). The balancer and Service bookkeeping
// are included in both protocols, so udp minus tcp is the UDP socket's own
// cost. The timed op is empty; the metrics are the result.
// "TCP" relays with goroutines, "TCP-eventloop" on the event loops (the
// command's default), where the loops accept.
func BenchmarkIdleServicePorts(b *testing.B) {
	for _, bc := range []struct {
		name     string
		proto    v1.Protocol
		dataPath string
	}{
		{"TCP", v1.ProtocolTCP, proxier.DataPathGoroutines},
		{"TCP-eventloop", v1.ProtocolTCP, proxier.DataPathEventLoop},
		{"UDP", v1.ProtocolUDP, proxier.DataPathGoroutines},
	} {
		b.Run(bc.name, func(b *testing.B) { benchIdlePortsOf(b, bc.proto, bc.dataPath) })
	}
}

func benchIdlePortsOf(b *testing.B, proto v1.Protocol, dataPath string) {
	quietKlog()
	runtime.GC()
	runtime.GC()
	before := readMemStats()
	p := newBenchProxier(b, dataPath)
	for i := range benchIdlePorts {
		svc := benchService(i)
		svc.Spec.Ports[0].Protocol = proto
		slice := benchSlice(i, 0)
		*slice.Ports[0].Protocol = proto
		p.OnServiceAdd(svc)
		p.OnEndpointSliceAdd(slice)
	}
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.Sync()
	if n := len(p.DebugServices()); n < benchIdlePorts {
		b.Fatalf("only %d of %d service ports opened", n, benchIdlePorts)
	}
	settleGoroutines()
	runtime.GC() // shrinks the stacks that grew while syncing
	runtime.GC()
	after := readMemStats()
	runtime.KeepAlive(p)
	for b.Loop() {
	}
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / benchIdlePorts }
	b.ReportMetric(per(after.HeapInuse, before.HeapInuse), "heap-B/port")
	b.ReportMetric(per(after.HeapAlloc, before.HeapAlloc), "live-B/port")
	b.ReportMetric(per(after.StackInuse, before.StackInuse), "stack-B/port")
}

// settleGoroutines waits until every socket's goroutines have started
// (and allocated what they keep): the goroutine count stops moving.
func settleGoroutines() {
	n := runtime.NumGoroutine()
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			time.Sleep(50 * time.Millisecond)
			return
		}
		n = m
	}
}

func readMemStats() runtime.MemStats {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}
