package iptables

import (
	"net/netip"
	"slices"
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

// BenchmarkKernel10k is the real iptables (in a namespace of its own) with
// 10,000 Services (a ClusterIP and a NodePort each, ~40,000 rules):
// "update" is one Service's port moved and back through Update (the
// change path: a delta, no read-back), "change-by-sync" the same change
// through the full Sync, as every change went before, and "sync" the
// periodic Sync with nothing to change (one iptables-save of every table
// and the comparison).
func BenchmarkKernel10k(b *testing.B) {
	requireRealIptables(b)
	ns := newNetns(b)
	runner := newNSRunner(b, ns, IPv4)
	r := New(runner, testConfig)
	portals := manyPortals(10000)
	if err := r.Sync(portals); err != nil {
		b.Fatal(err)
	}
	moved := slices.Clone(portals)
	moved[2*4321].Port = 81
	// change runs one Service change through sync, alternating between the
	// two versions, and reports iptables-restore runs per change.
	change := func(sync func([]Portal) error) func(b *testing.B) {
		return func(b *testing.B) {
			versions := [][]Portal{moved, portals}
			before := runner.restores.Load()
			i := 0
			for b.Loop() {
				if err := sync(versions[i%2]); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(float64(runner.restores.Load()-before)/float64(b.N), "restores/op")
			if err := sync(portals); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("update", change(r.Update))
	// A Service added and removed: its guard and NodePort accept in
	// filter, its portals in nat.
	extra := Portal{Name: "bench/extra:http", Protocol: TCP, IP: netip.MustParseAddr("10.97.0.1"), Port: 80, ProxyPort: 19999}
	extraNP := Portal{Name: "bench/extra:http", Protocol: TCP, Port: 30999, NodePort: true, ProxyPort: 19999}
	b.Run("update-add-delete", func(b *testing.B) {
		versions := [][]Portal{append(slices.Clone(portals), extra, extraNP), portals}
		before := runner.restores.Load()
		i := 0
		for b.Loop() {
			if err := r.Update(versions[i%2]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(runner.restores.Load()-before)/float64(b.N), "restores/op")
		if err := r.Update(portals); err != nil {
			b.Fatal(err)
		}
	})
	// What a change cost before Update: the full Sync (read back, compare,
	// rewrite the two changed chains, read back again).
	b.Run("change-by-sync", change(r.Sync))
	b.Run("sync", func(b *testing.B) {
		for b.Loop() {
			if err := r.Sync(portals); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkKernelFirstSync10k is the first Sync of 10,000 Services (a
// ClusterIP and a NodePort each) into a namespace without our rules, the
// rules flushed between iterations: "one-restore" writes the nat table
// with one iptables-restore, "split" with one per half side by side (the
// default past defaultSplitRestoreAbove rules).
func BenchmarkKernelFirstSync10k(b *testing.B) {
	requireRealIptables(b)
	ns := newNetns(b)
	runner := newNSRunner(b, ns, IPv4)
	portals := manyPortals(10000)
	for _, bc := range []struct {
		name  string
		split int
	}{{"one-restore", 1 << 30}, {"split", defaultSplitRestoreAbove}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				for _, table := range []string{"nat", "filter"} {
					inNetns(b, ns, "iptables", "-t", table, "-F")
					inNetns(b, ns, "iptables", "-t", table, "-X")
				}
				r := New(runner.real, testConfig)
				r.splitRestoreAbove = bc.split
				b.StartTimer()
				var err error
				runner.th.do(func() { err = r.Sync(portals) })
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
