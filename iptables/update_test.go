package iptables

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func updateOK(t *testing.T, r *Rules, portals []Portal) {
	t.Helper()
	if err := r.Update(portals); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

// restoreLineKinds counts the kinds of lines ("-A", "-D", "-I", ":") in
// every restore input so far.
func restoreLineKinds(fake *FakeRunner) map[string]int {
	out := map[string]int{}
	for _, w := range fake.Writes() {
		for line := range strings.Lines(string(w)) {
			switch {
			case strings.HasPrefix(line, ":"):
				out[":"]++
			case strings.HasPrefix(line, "-"):
				out[line[:2]]++
			}
		}
	}
	return out
}

func TestUpdateWritesOnlyTheDelta(t *testing.T) {
	extraIP := Portal{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("203.0.113.99"), Port: 80, ProxyPort: 40001}
	newNodePort := Portal{Name: "default/api:https", Protocol: TCP, Port: 30443, NodePort: true, ProxyPort: 40100}
	dnsMoved := slices.Clone(webPortals())
	dnsMoved[4].ProxyPort = 40222
	portMoved := slices.Clone(webPortals())
	portMoved[0].Port = 81
	tests := []struct {
		name    string
		portals []Portal
		want    map[string]int // restore lines by kind
		writes  int
	}{
		{"unchanged", webPortals(), map[string]int{}, 0},
		{"new externalIP on a known proxy port", append(webPortals(), extraIP), map[string]int{"-I": 2}, 1},
		// filter (non-local accept, guard, portals' accept, reject), then
		// nat (container, host), in one restore.
		{"new NodePort service", append(webPortals(), newNodePort), map[string]int{"-I": 6}, 1},
		{"proxy port moved", dnsMoved, map[string]int{"-D": 5, "-I": 5}, 1},
		{"service port moved", portMoved, map[string]int{"-D": 2, "-I": 2}, 1},
		{"services removed", webPortals()[:4], map[string]int{"-D": 10}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := NewFakeRunner(IPv4)
			r := New(fake, testConfig)
			syncOK(t, r, webPortals())
			fake.ResetCalls()
			updateOK(t, r, tt.portals)
			assertState(t, fake, r, tt.portals)
			if got := restoreLineKinds(fake); !maps.Equal(got, tt.want) {
				t.Errorf("restore lines %v, want %v:\n%s", got, tt.want, fake.Writes())
			}
			if n := len(fake.Writes()); n != tt.writes {
				t.Errorf("%d restores, want %d", n, tt.writes)
			}
			for _, call := range fake.Calls() {
				if call != "Restore" {
					t.Errorf("Update made call %q; it must only restore", call)
				}
			}
		})
	}
}

// Update knows nothing before a Sync (nor after a failure): it does the
// full Sync, read-back and jumps included.
func TestUpdateFirstIsFullSync(t *testing.T) {
	fake := NewFakeRunner(IPv4)
	r := New(fake, testConfig)
	updateOK(t, r, webPortals())
	assertState(t, fake, r, webPortals())

	fake.Errors = map[string]error{"Restore": errTest}
	moved := slices.Clone(webPortals())
	moved[0].Port = 81
	if err := r.Update(moved); err == nil {
		t.Fatal("Update succeeded with failing restores")
	}
	fake.Errors = nil
	fake.ResetCalls()
	updateOK(t, r, moved)
	assertState(t, fake, r, moved)
	if calls := fake.Calls(); !slices.Contains(calls, "Save") {
		t.Errorf("Update after a failure did not read back: %q", calls)
	}
}

type testError string

func (e testError) Error() string { return string(e) }

const errTest = testError("injected")

// Update repairs nothing by itself, but when its delta meets a chain
// someone changed (a rule it would delete is gone) it falls back to a full
// Sync; and the next Sync repairs what Update could not see.
func TestUpdateDriftIsRepairedBySync(t *testing.T) {
	fake := NewFakeRunner(IPv4)
	r := New(fake, testConfig)
	syncOK(t, r, webPortals())

	// A rule of an unrelated Service deleted by hand: Update does not look.
	args, _ := splitRule(fake.Rules(TableNAT, ChainPortalsHost)[4])
	must(t, fake.DeleteRule(TableNAT, ChainPortalsHost, args...))
	moved := slices.Clone(webPortals())
	moved[0].Port = 81
	updateOK(t, r, moved)
	if got, want := len(fake.Rules(TableNAT, ChainPortalsHost)), len(r.desired(moved)[ChainPortalsHost])-1; got != want {
		t.Fatalf("host chain holds %d rules, want %d (the deleted one still missing)", got, want)
	}
	syncOK(t, r, moved) // the periodic sync
	assertState(t, fake, r, moved)

	// The rule Update must delete is gone: its restore fails, and it
	// rewrites in full instead.
	args, _ = splitRule(fake.Rules(TableNAT, ChainPortalsContainer)[0])
	must(t, fake.DeleteRule(TableNAT, ChainPortalsContainer, args...))
	updateOK(t, r, webPortals())
	assertState(t, fake, r, webPortals())
}

// Random sequences of portal sets through Update leave exactly the desired
// rules after every step, as a full Sync would; now and then someone
// flushes a chain, which the next Sync repairs.
func TestUpdateRandomSequences(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pool := make([]Portal, 0, 60)
	for i := range 20 {
		name := "ns/svc-" + string(rune('a'+i)) + ":p"
		ip := netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)})
		pool = append(pool,
			Portal{Name: name, Protocol: TCP, IP: ip, Port: 80, ProxyPort: 40000 + i},
			Portal{Name: name, Protocol: TCP, Port: 30000 + i, NodePort: true, ProxyPort: 40000 + i},
			Portal{Name: name, Protocol: TCP, IP: netip.AddrFrom4([4]byte{203, 0, 113, byte(i % 4)}), Port: 80, ProxyPort: 41000 + i, ClusterProxyPort: 40000 + i})
	}
	for _, bucketAbove := range []int{defaultBucketAbove, 30} {
		t.Run(fmt.Sprintf("bucketAbove=%d", bucketAbove), func(t *testing.T) {
			randomSequence(t, rng, pool, bucketAbove)
		})
	}
}

// randomSequence runs 400 random steps over pool; with a small bucketAbove
// the chains move in and out of buckets as the set grows and shrinks.
func randomSequence(t *testing.T, rng *rand.Rand, pool []Portal, bucketAbove int) {
	cfg := testConfig
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	fake := NewFakeRunner(IPv4)
	r := New(fake, cfg)
	r.bucketAbove = bucketAbove
	buckets := 0
	in, bump := make([]bool, len(pool)), make([]int, len(pool))
	var portals []Portal
	for step := range 400 {
		// Mostly one to three portals change, as Service updates do; now
		// and then most of them.
		flips := 1 + rng.IntN(3)
		if step%10 == 0 {
			flips = len(pool)
		}
		for range flips {
			i := rng.IntN(len(pool))
			if rng.IntN(4) == 0 {
				bump[i] = rng.IntN(2)
			} else {
				in[i] = !in[i]
			}
		}
		portals = portals[:0:0]
		for i, p := range pool {
			if in[i] {
				p.Port += bump[i]
				portals = append(portals, p)
			}
		}
		rng.Shuffle(len(portals), func(i, j int) { portals[i], portals[j] = portals[j], portals[i] })
		if step%50 == 49 {
			syncOK(t, r, portals)
		} else {
			updateOK(t, r, portals)
		}
		assertState(t, fake, r, portals)
		if t.Failed() {
			t.Fatalf("step %d", step)
		}
		if len(fake.Chains(TableNAT)) > 8 {
			buckets++
		}
	}
	if bucketAbove < defaultBucketAbove && (buckets < 50 || buckets > 350) {
		t.Errorf("buckets in use in %d of 400 steps; want the chains to move in and out of them", buckets)
	}
}

// Chains past bucketAbove are split into buckets that Sync creates,
// repairs and deletes again when the chain shrinks, and Cleanup removes.
func TestSyncBuckets(t *testing.T) {
	fake := NewFakeRunner(IPv4)
	r := New(fake, testConfig)
	r.bucketAbove = 4
	many := manyPortals(40)
	syncOK(t, r, many)
	assertState(t, fake, r, many)
	parent := fake.Rules(TableNAT, ChainPortalsContainer)
	if len(parent) != numBuckets || parent[0] != "-j "+bucketChain(ChainPortalsContainer, 0) {
		t.Fatalf("%s holds %q, want a jump to each of %d buckets", ChainPortalsContainer, parent, numBuckets)
	}
	// A bucket's rule deleted, another bucket flushed, a jump deleted.
	var full string
	for b := range numBuckets {
		if name := bucketChain(ChainPortalsHost, b); len(fake.Rules(TableNAT, name)) > 0 {
			full = name
		}
	}
	args, _ := splitRule(fake.Rules(TableNAT, full)[0])
	must(t, fake.DeleteRule(TableNAT, full, args...))
	must(t, fake.Restore(restoreLines("*nat", ":"+bucketChain(ChainPortalsContainer, 7)+" - [0:0]", "COMMIT")))
	must(t, fake.DeleteRule(TableFilter, ChainNodePortNonLocal, "-j", bucketChain(ChainNodePortNonLocal, 3)))
	syncOK(t, r, many)
	assertState(t, fake, r, many)

	few := many[:4]
	syncOK(t, r, few)
	assertState(t, fake, r, few) // no bucket chain left
	syncOK(t, r, many)
	must(t, Cleanup(fake))
	for _, table := range []Table{TableNAT, TableFilter} {
		if chains := fake.Chains(table); len(chains) != len(builtinChains[table]) {
			t.Errorf("after Cleanup %s holds chains %q", table, chains)
		}
	}
}
