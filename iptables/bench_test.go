package iptables

import (
	"net/netip"
	"strconv"
	"testing"
)

// manyPortals returns n services, each with a ClusterIP portal and a
// NodePort, TCP, as a 10k-service cluster would have.
func manyPortals(n int) []Portal {
	out := make([]Portal, 0, 2*n)
	for i := range n {
		name := "bench/svc-" + strconv.Itoa(i) + ":http"
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		out = append(out,
			Portal{Name: name, Protocol: TCP, IP: ip, Port: 80, ProxyPort: 20000 + i%40000},
			Portal{Name: name, Protocol: TCP, Port: 30000 + i%2768, NodePort: true, ProxyPort: 20000 + i%40000})
	}
	return out
}

func BenchmarkRender10k(b *testing.B) {
	r := New(NewFakeRunner(IPv4), testConfig)
	portals := manyPortals(10000)
	for b.Loop() {
		r.Render(portals)
	}
}

// BenchmarkSyncUnchanged10k is the periodic sync's cost on our side:
// parse the read-back and compare, no write.
func BenchmarkSyncUnchanged10k(b *testing.B) {
	fake := NewFakeRunner(IPv4)
	r := New(fake, testConfig)
	portals := manyPortals(10000)
	if err := r.Sync(portals); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := r.Sync(portals); err != nil {
			b.Fatal(err)
		}
	}
}
