package loadbalancer

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"k8s.io/utils/clock"
)

// benchClients is how many distinct client IPs the benchmarks cycle through;
// all are pinned before timing, so the affinity runs measure the steady
// state (lookup + refresh), not first contact.
const benchClients = 1024

func BenchmarkNextNoAffinity(b *testing.B) { benchmarkNext(b, AffinityPolicy{}) }

func BenchmarkNextAffinity(b *testing.B) {
	benchmarkNext(b, AffinityPolicy{ClientIP: true, Timeout: DefaultAffinityTimeout})
}

func benchmarkNext(b *testing.B, policy AffinityPolicy) {
	clients := make([]netip.Addr, benchClients)
	for i := range clients {
		clients[i] = netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
	}
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("%dendpoints", n), func(b *testing.B) {
			sp := benchServicePort(b, n, policy, clients)
			b.Run("serial", func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if _, err := sp.Next(clients[i%benchClients], false); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
			b.Run("parallel", func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						if _, err := sp.Next(clients[i%benchClients], false); err != nil {
							b.Error(err)
							return
						}
						i++
					}
				})
			})
		})
	}
}

// benchServicePort builds a service port with n ready endpoints on the real
// clock (its Now is part of the cost Next pays in production) and pins
// every client once.
func benchServicePort(b *testing.B, n int, policy AffinityPolicy, clients []netip.Addr) *ServicePort {
	b.Helper()
	lb := New(clock.RealClock{}, Limits{})
	svc := svcName("bench")
	lb.SetAffinity(svc, policy)
	lb.SetEndpoints(svc, readyBenchEndpoints(n))
	sp := lb.ServicePort(svc)
	for _, c := range clients {
		if _, err := sp.Next(c, false); err != nil {
			b.Fatal(err)
		}
	}
	return sp
}

// BenchmarkSetEndpoints measures an endpoint change of one service port
// (the "endpoint change live in < 10 ms" path), alternating two sets that
// differ by one endpoint, with pinned clients to re-check.
func BenchmarkSetEndpoints(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("%dendpoints", n), func(b *testing.B) {
			lb := New(clock.RealClock{}, Limits{})
			svc := svcName("bench")
			lb.SetAffinity(svc, AffinityPolicy{ClientIP: true, Timeout: time.Hour})
			a := readyBenchEndpoints(n)
			c := readyBenchEndpoints(n + 1)[1:]
			lb.SetEndpoints(svc, a)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i%2 == 0 {
					lb.SetEndpoints(svc, c)
				} else {
					lb.SetEndpoints(svc, a)
				}
				i++
			}
		})
	}
}

func readyBenchEndpoints(n int) []Endpoint {
	eps := make([]Endpoint, n)
	for i := range eps {
		eps[i] = Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 8080), Ready: true}
	}
	return eps
}
