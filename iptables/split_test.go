package iptables

import (
	"net/netip"
	"strings"
	"testing"
)

// splitRecorder is a fake that can restore concurrently: it records each
// batch and applies its inputs one after the other.
type splitRecorder struct {
	*FakeRunner
	batches [][][]byte
}

func (s *splitRecorder) CanRestoreConcurrently() bool { return true }

func (s *splitRecorder) RestoreConcurrently(inputs [][]byte) error {
	s.batches = append(s.batches, inputs)
	for _, in := range inputs {
		if err := s.FakeRunner.Restore(in); err != nil {
			return err
		}
	}
	return nil
}

// A large nat rewrite goes to two restores: the chains PREROUTING reaches
// with PREROUTING's jumps, and those OUTPUT reaches with OUTPUT's; each
// names nothing of the other, so the kernel ends up as with one restore,
// buckets created and dropped included.
func TestSyncSplitsLargeNATRewrite(t *testing.T) {
	rec := &splitRecorder{FakeRunner: NewFakeRunner(IPv4)}
	r := New(rec, testConfig)
	r.bucketAbove, r.splitRestoreAbove = 8, 20
	many := manyPortals(40)
	syncOK(t, r, many)
	assertState(t, rec.FakeRunner, r, many)
	if len(rec.batches) != 1 || len(rec.batches[0]) != 2 {
		t.Fatalf("concurrent batches %d, want one of 2 inputs", len(rec.batches))
	}
	container, host := string(rec.batches[0][0]), string(rec.batches[0][1])
	if strings.Contains(container, "HOST") || strings.Contains(host, "CONTAINER") ||
		!strings.Contains(container, "-I PREROUTING 1 ") || !strings.Contains(host, "-I OUTPUT 1 ") ||
		!strings.Contains(container, ":"+bucketChain(ChainPortalsContainer, 0)) {
		t.Fatalf("halves mixed up:\n%s\n---\n%s", container, host)
	}
	// Shrunk below bucketAbove: each half drops its own buckets.
	r.splitRestoreAbove = 0
	few := many[:2]
	syncOK(t, r, few)
	assertState(t, rec.FakeRunner, r, few)
	if len(rec.batches) != 2 || len(rec.batches[1]) != 2 || !strings.Contains(string(rec.batches[1][1]), "-X "+bucketChain(ChainPortalsHost, 0)) {
		t.Fatalf("the shrinking rewrite: %d batches, want 2, the second dropping the host buckets", len(rec.batches))
	}
	// Small rewrites keep one restore.
	r.splitRestoreAbove = defaultSplitRestoreAbove
	syncOK(t, r, append(few, Portal{Name: "default/x:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.7.7"), Port: 80, ProxyPort: 40777}))
	if len(rec.batches) != 2 {
		t.Errorf("a small rewrite went to %d concurrent batches", len(rec.batches)-2)
	}
}

// The real runner's two restores side by side, in a namespace: nf_tables
// takes both commits into one table (the second on the new generation) and
// the chains hold exactly what one restore would write.
func TestKernelSplitNATRestore(t *testing.T) {
	requireRealIptables(t)
	ns := newNetns(t)
	for _, f := range []Family{IPv4} {
		runner := newNSRunner(t, ns, f)
		cr, ok := runner.real.(concurrentRestorer)
		if !ok {
			t.Fatal("the real runner cannot restore concurrently")
		}
		if !cr.CanRestoreConcurrently() {
			t.Skip("iptables-legacy: Sync writes nat with one restore")
		}
		cfg := Config{Family: f, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("192.168.1.10")}
		r := New(runner.real, cfg)
		r.splitRestoreAbove = 100
		portals := manyPortals(2000)
		for _, ps := range [][]Portal{portals, portals[:600], portals} { // first, shrink, grow
			var err error
			runner.th.do(func() { err = r.Sync(ps) })
			if err != nil {
				t.Fatalf("Sync: %v", err)
			}
			assertKernelState(t, ns, r, ps)
		}
	}
}

// Every nat chain of ours, buckets included, has its side; the built-in
// chains go with the side they jump to.
func TestNATSideOfEveryChain(t *testing.T) {
	for _, c := range ownedChains {
		if c.table != TableNAT {
			continue
		}
		want := 0
		if c.name == ChainPortalsHost || c.name == ChainNodePortHost {
			want = 1
		}
		for _, name := range []string{c.name, bucketChain(c.name, 0), bucketChain(c.name, numBuckets-1)} {
			if got := natSide(name); got != want {
				t.Errorf("natSide(%s) = %d, want %d", name, got, want)
			}
		}
	}
	for _, j := range jumps {
		if j.table == TableNAT && natSide(j.from) != natSide(j.to) {
			t.Errorf("jump %s -> %s crosses sides", j.from, j.to)
		}
	}
}
