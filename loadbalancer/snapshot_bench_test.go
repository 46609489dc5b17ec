package loadbalancer

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"
)

// BenchmarkNextDuringSnapshot measures Next (a sticky hit, what every new
// connection of a known client pays) while another goroutine takes
// Snapshots of the same service port in a loop, as /debug/services and the
// fault API's proxy listing do. A Snapshot that sorts under the port's lock
// makes Next wait for the sort.
func BenchmarkNextDuringSnapshot(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("%dclients", n), func(b *testing.B) {
			clients := make([]netip.Addr, n)
			for i := range clients {
				clients[i] = netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)})
			}
			lb := newBenchBalancer()
			svc := svcName("snap")
			lb.SetAffinity(svc, AffinityPolicy{ClientIP: true, Timeout: time.Hour})
			lb.SetEndpoints(svc, readyBenchEndpoints(10))
			sp := lb.ServicePort(svc)
			for _, c := range clients {
				if _, err := sp.Next(c, false); err != nil {
					b.Fatal(err)
				}
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
						sp.Snapshot()
					}
				}
			})
			i := 0
			for b.Loop() {
				if _, err := sp.Next(clients[i%n], false); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.StopTimer()
			close(stop)
			wg.Wait()
		})
	}
}

func newBenchBalancer() *LoadBalancer { return New(clock.RealClock{}, Limits{}) }
