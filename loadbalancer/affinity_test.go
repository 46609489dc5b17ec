package loadbalancer

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

func TestAffinityEntryExpired(t *testing.T) {
	const timeout = 3 * time.Second
	tests := []struct {
		gap  time.Duration
		want bool
	}{
		{gap: 0, want: false},
		{gap: time.Second, want: false},
		{gap: 2 * time.Second, want: false},
		{gap: 3*time.Second - time.Nanosecond, want: false},
		{gap: 3 * time.Second, want: true}, // legacy: whole seconds, ">="
		{gap: 4 * time.Second, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.gap.String(), func(t *testing.T) {
			e := affinityEntry{endpoint: backend(1), lastUsed: testStart}
			if got := e.expired(testStart.Add(tt.gap), timeout); got != tt.want {
				t.Errorf("expired after %v at timeout %v = %v, want %v", tt.gap, timeout, got, tt.want)
			}
		})
	}
}

func TestAffinityTableSweep(t *testing.T) {
	const timeout = 10 * time.Second
	now := testStart.Add(time.Hour)
	tbl := affinityTable{
		ip("192.0.2.1"): {endpoint: backend(1), lastUsed: now.Add(-timeout)},               // expired exactly
		ip("192.0.2.2"): {endpoint: backend(1), lastUsed: now.Add(-timeout - time.Second)}, // expired
		ip("192.0.2.3"): {endpoint: backend(2), lastUsed: now.Add(-timeout + time.Second)}, // live
		ip("192.0.2.4"): {endpoint: backend(2), lastUsed: now},                             // live
	}
	if got := tbl.sweep(now, timeout); got != 2 {
		t.Errorf("sweep = %d, want 2", got)
	}
	for _, live := range []string{"192.0.2.3", "192.0.2.4"} {
		if _, ok := tbl[ip(live)]; !ok {
			t.Errorf("live entry %s was swept", live)
		}
	}
	if len(tbl) != 2 {
		t.Errorf("table has %d entries after sweep, want 2", len(tbl))
	}
}

// TestNextBoundsTableWithoutSweep checks the promise made at evictSample:
// with clients that come once and never again, and Sweep never called, the
// table stays around the number of clients seen within one timeout instead
// of growing with every client ever seen.
func TestNextBoundsTableWithoutSweep(t *testing.T) {
	const (
		timeout        = 10 * time.Second
		clientsPerSec  = 100
		seconds        = 200
		liveClientsMax = clientsPerSec * 10 // clients seen within one timeout
	)
	lb, clk := newTestBalancer(t)
	svc := svcName("churn")
	lb.SetAffinity(svc, clientIPPolicy(timeout))
	lb.SetEndpoints(svc, readyEndpoints(3))
	sp := lb.ServicePort(svc)

	maxSize := 0
	for s := range seconds {
		for c := range clientsPerSec {
			n := s*clientsPerSec + c
			client := netip.AddrFrom4([4]byte{10, 1, byte(n >> 8), byte(n)})
			mustNext(t, sp, client, false)
		}
		clk.SetTime(clk.Now().Add(time.Second))
		sp.mu.Lock()
		maxSize = max(maxSize, len(sp.clients))
		sp.mu.Unlock()
	}
	// seconds*clientsPerSec = 20,000 distinct clients went through; allow
	// the live ones plus as many expired ones, plus slack for randomness.
	if limit := 2*liveClientsMax + liveClientsMax/2; maxSize > limit {
		t.Errorf("affinity table reached %d entries for %d live clients, want <= %d", maxSize, liveClientsMax, limit)
	}
	t.Logf("max table size %d with %d live clients", maxSize, liveClientsMax)
}

func TestEvictSomeInspectsAtMostSample(t *testing.T) {
	now := testStart
	tbl := make(affinityTable)
	for i := range 50 {
		tbl[ip(fmt.Sprintf("192.0.2.%d", i+1))] = affinityEntry{endpoint: backend(1), lastUsed: now.Add(-time.Hour)}
	}
	tbl.evictSome(now, time.Second)
	if got := 50 - len(tbl); got != evictSample {
		t.Errorf("evictSome deleted %d expired entries, want %d", got, evictSample)
	}
}
