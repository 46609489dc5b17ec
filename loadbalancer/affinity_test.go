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
	tbl := newAffinityTable(0)
	// Written in order of use, as Next writes them.
	for _, e := range []struct {
		ip       string
		lastUsed time.Time
	}{
		{"192.0.2.2", now.Add(-timeout - time.Second)}, // expired
		{"192.0.2.1", now.Add(-timeout)},               // expired exactly
		{"192.0.2.3", now.Add(-timeout + time.Second)}, // live
		{"192.0.2.4", now},                             // live
	} {
		tbl.put(ip(e.ip), affinityEntry{endpoint: backend(1), lastUsed: e.lastUsed})
	}
	if got := tbl.sweep(now, timeout); got != 2 {
		t.Errorf("sweep = %d, want 2", got)
	}
	for _, live := range []string{"192.0.2.3", "192.0.2.4"} {
		if _, ok := tbl.get(ip(live)); !ok {
			t.Errorf("live entry %s was swept", live)
		}
	}
	if tbl.len() != 2 {
		t.Errorf("table has %d entries after sweep, want 2", tbl.len())
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
		maxSize = max(maxSize, sp.clients.len())
		sp.mu.Unlock()
	}
	// seconds*clientsPerSec = 20,000 distinct clients went through; allow
	// the live ones plus as many expired ones, plus slack for randomness.
	if limit := 2*liveClientsMax + liveClientsMax/2; maxSize > limit {
		t.Errorf("affinity table reached %d entries for %d live clients, want <= %d", maxSize, liveClientsMax, limit)
	}
	t.Logf("max table size %d with %d live clients", maxSize, liveClientsMax)
}

func TestExpireOldestDeletesAtMostBatch(t *testing.T) {
	now := testStart
	tbl := newAffinityTable(0)
	for i := range 50 {
		tbl.put(ip(fmt.Sprintf("192.0.2.%d", i+1)), affinityEntry{endpoint: backend(1), lastUsed: now.Add(-time.Hour)})
	}
	if got := tbl.expireOldest(now, time.Second, expireBatch); got != expireBatch {
		t.Errorf("expireOldest deleted %d, want %d", got, expireBatch)
	}
	if got := 50 - tbl.len(); got != expireBatch {
		t.Errorf("table lost %d expired entries, want %d", got, expireBatch)
	}
}
