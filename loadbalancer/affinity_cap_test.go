package loadbalancer

import (
	"net/netip"
	"runtime"
	"testing"
	"time"
)

// newCappedPort returns a ClientIP service port with 3 endpoints whose
// affinity table holds at most maxEntries clients.
func newCappedPort(t *testing.T, maxEntries int, timeout time.Duration) *ServicePort {
	t.Helper()
	lb, _ := newTestBalancer(t)
	lb.limits.MaxAffinityEntries = maxEntries
	svc := svcName("capped")
	lb.SetAffinity(svc, clientIPPolicy(timeout))
	lb.SetEndpoints(svc, readyEndpoints(3))
	return lb.ServicePort(svc)
}

// forgedSource is the i-th spoofed client: IPv4 from 10.0.0.0/8 for even i,
// a rotating IPv6 address (privacy extensions) for odd i.
func forgedSource(i int) netip.Addr {
	if i%2 == 0 {
		return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	}
	return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i), 14: byte(i >> 8), 13: byte(i >> 16)})
}

func TestAffinityFloodStaysWithinCap(t *testing.T) {
	const (
		maxEntries = 100
		flood      = 50_000
	)
	sp := newCappedPort(t, maxEntries, DefaultAffinityTimeout) // nothing expires during the flood
	largest := 0
	for i := range flood {
		mustNext(t, sp, forgedSource(i), false)
		largest = max(largest, sp.affinityStats().Entries)
	}
	if largest > maxEntries {
		t.Errorf("a flood of %d forged sources grew the table to %d entries, cap %d", flood, largest, maxEntries)
	}
	st := sp.affinityStats()
	if st.Entries != maxEntries || st.Evicted != flood-maxEntries {
		t.Errorf("after the flood: %d entries, %d evicted; want %d and %d", st.Entries, st.Evicted, maxEntries, flood-maxEntries)
	}
	// The table holds the most recent sources, and the snapshot shows them.
	snap := sp.Snapshot()
	if len(snap.Clients) != maxEntries || snap.Evicted != st.Evicted {
		t.Errorf("snapshot: %d clients, %d evicted; want %d and %d", len(snap.Clients), snap.Evicted, maxEntries, st.Evicted)
	}
	if _, ok := sp.clients.get(forgedSource(flood - 1)); !ok {
		t.Error("the last source of the flood is not in the table")
	}
	if _, ok := sp.clients.get(forgedSource(flood - maxEntries - 1)); ok {
		t.Error("a source older than the cap is still in the table")
	}
}

func TestAffinityCapEvictsLeastRecentlyUsed(t *testing.T) {
	sp := newCappedPort(t, 3, time.Hour)
	a, b, c, d := ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.3"), ip("192.0.2.4")
	pinA := mustNext(t, sp, a, false)
	mustNext(t, sp, b, false)
	pinC := mustNext(t, sp, c, false)
	mustNext(t, sp, a, false) // a used again: b is now the least recently used
	mustNext(t, sp, d, false) // the table is full: b goes

	if _, ok := sp.clients.get(b); ok {
		t.Error("b, the least recently used client, was kept")
	}
	for _, client := range []netip.Addr{a, c, d} {
		if _, ok := sp.clients.get(client); !ok {
			t.Errorf("%v was evicted instead of b", client)
		}
	}
	if got := sp.affinityStats().Evicted; got != 1 {
		t.Errorf("evicted = %d, want 1", got)
	}
	// Survivors keep their pins; a re-pin of a known client evicts nobody.
	if got := mustNext(t, sp, a, false); got != pinA {
		t.Errorf("a moved from %v to %v", pinA, got)
	}
	if got := mustNext(t, sp, c, false); got != pinC {
		t.Errorf("c moved from %v to %v", pinC, got)
	}
	mustNext(t, sp, a, true)
	if got := sp.affinityStats(); got.Evicted != 1 || got.Entries != 3 {
		t.Errorf("after a re-pin: %+v, want 3 entries and 1 eviction", got)
	}
}

// TestAffinityCapZeroIsUnlimited: 0 keeps the old behaviour, a table as
// large as the clients seen within one timeout.
func TestAffinityCapZeroIsUnlimited(t *testing.T) {
	sp := newCappedPort(t, 0, DefaultAffinityTimeout)
	for i := range 5000 {
		mustNext(t, sp, forgedSource(i), false)
	}
	if st := sp.affinityStats(); st.Entries != 5000 || st.Evicted != 0 {
		t.Errorf("unlimited table: %+v, want 5000 entries and no eviction", st)
	}
}

// TestAffinityExpiryIsOldestFirst: the expired clients are the least
// recently used ones, so Next's bounded expiry and the sweep find them at
// the end of the list while live clients (used later) stay.
func TestAffinityExpiryIsOldestFirst(t *testing.T) {
	lb, clk := newTestBalancer(t)
	svc := svcName("expiry")
	lb.SetAffinity(svc, clientIPPolicy(10*time.Second))
	lb.SetEndpoints(svc, readyEndpoints(3))
	sp := lb.ServicePort(svc)
	old, refreshed, fresh := ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.3")
	mustNext(t, sp, old, false)
	mustNext(t, sp, refreshed, false)
	clk.SetTime(clk.Now().Add(6 * time.Second))
	mustNext(t, sp, refreshed, false) // last use now t0+6s
	mustNext(t, sp, fresh, false)
	clk.SetTime(clk.Now().Add(5 * time.Second)) // t0+11s: only old expired
	if n := lb.Sweep(); n != 1 {
		t.Errorf("Sweep = %d, want 1 (old)", n)
	}
	for _, c := range []netip.Addr{refreshed, fresh} {
		if _, ok := sp.clients.get(c); !ok {
			t.Errorf("%v expired although used within the timeout", c)
		}
	}
}

// TestAffinityEntryCost measures what one affinity entry costs, the figure
// behind DefaultMaxAffinityEntries (about 2 MiB per full table).
func TestAffinityEntryCost(t *testing.T) {
	const n = DefaultMaxAffinityEntries
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tbl := newAffinityTable(n)
	now := testStart
	for i := range n {
		tbl.put(forgedSource(i), affinityEntry{endpoint: backend(1), lastUsed: now})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perEntry := float64(after.HeapAlloc-before.HeapAlloc) / n
	runtime.KeepAlive(tbl)
	t.Logf("%.0f bytes per affinity entry, %.2f MiB for a full table of %d", perEntry, perEntry*n/(1<<20), n)
	if perEntry > 300 {
		t.Errorf("%.0f bytes per affinity entry, want <= 300 (the default cap's memory bound assumes it)", perEntry)
	}
}

// Every ClientIP service port is in AffinityStats from its start, at 0
// entries, as the other per-port series are (/metrics showed its series
// only from its first client); a port without affinity is not.
func TestAffinityStatsListEveryClientIPPort(t *testing.T) {
	lb, _ := newTestBalancer(t)
	sticky, plain := svcName("sticky"), svcName("plain")
	lb.SetAffinity(sticky, clientIPPolicy(time.Second))
	lb.SetEndpoints(sticky, readyEndpoints(2))
	lb.SetEndpoints(plain, readyEndpoints(2))
	want := func(when string, entries int) {
		t.Helper()
		stats := lb.AffinityStats()
		if st, ok := stats[sticky]; !ok || st.Entries != entries {
			t.Errorf("%s: sticky %+v (listed %v), want %d entries", when, st, ok, entries)
		}
		if _, ok := stats[plain]; ok {
			t.Errorf("%s: a port without affinity is listed", when)
		}
	}
	want("before any client", 0)
	mustNext(t, lb.ServicePort(sticky), netip.MustParseAddr("10.0.0.1"), false)
	want("after a client", 1)
}
