package loadbalancer

import (
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"
)

// TestConcurrentNextAndUpdates runs Next from many goroutines while the
// control plane changes endpoints and affinity, sweeps and snapshots. Under
// -race it proves the locking; it also checks every pick is an endpoint the
// service had at some point.
func TestConcurrentNextAndUpdates(t *testing.T) {
	lb := New(clock.RealClock{}, Limits{})
	svc := svcName("busy")
	lb.SetAffinity(svc, clientIPPolicy(time.Millisecond))
	sets := [][]Endpoint{readyEndpoints(3), readyEndpoints(5)[2:], readyEndpoints(1), nil, readyEndpoints(4)}
	known := newAddrSet(nil)
	for _, s := range sets {
		for _, e := range s {
			known[e.Addr] = struct{}{}
		}
	}
	lb.SetEndpoints(svc, sets[0])
	sp := lb.ServicePort(svc)

	const (
		workers = 8
		calls   = 2000
	)
	stop := make(chan struct{})
	var updaters sync.WaitGroup
	updaters.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			lb.SetEndpoints(svc, sets[i%len(sets)])
			if i%7 == 0 {
				lb.SetAffinity(svc, AffinityPolicy{ClientIP: i%2 == 0, Timeout: time.Duration(i%3+1) * time.Millisecond})
			}
			lb.Sweep()
			lb.Snapshot(svc)
			lb.ServicePortNames()
		}
	})

	errs := make(chan error, workers)
	var workersWG sync.WaitGroup
	for w := range workers {
		workersWG.Go(func() {
			for i := range calls {
				client := netip.AddrFrom4([4]byte{192, 0, 2, byte(w*16 + i%16)})
				ep, err := sp.Next(client, i%10 == 0)
				if errors.Is(err, ErrNoEndpoints) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				if _, ok := known[ep]; !ok {
					errs <- errors.New("picked unknown endpoint " + ep.String())
					return
				}
			}
		})
	}
	workersWG.Wait()
	close(stop)
	updaters.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestNextDoesNotAllocate guards the hot path: once a client is known, Next
// makes no heap allocation, with or without affinity.
func TestNextDoesNotAllocate(t *testing.T) {
	tests := []struct {
		name   string
		policy AffinityPolicy
		reset  bool
	}{
		{name: "no affinity", policy: AffinityPolicy{}},
		{name: "ClientIP hit", policy: clientIPPolicy(time.Hour)},
		{name: "ClientIP reset (re-pin of a known client)", policy: clientIPPolicy(time.Hour), reset: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, _ := newTestBalancer(t)
			svc := svcName("alloc")
			lb.SetAffinity(svc, tt.policy)
			lb.SetEndpoints(svc, readyEndpoints(10))
			sp := lb.ServicePort(svc)
			mustNext(t, sp, clientA, false)
			if n := testing.AllocsPerRun(1000, func() { _, _ = sp.Next(clientA, tt.reset) }); n != 0 {
				t.Errorf("Next allocates %v times per call, want 0", n)
			}
		})
	}
}
