package iptables

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// These tests run the real runner against the real kernel, inside a
// network namespace each test creates and deletes.

// kernelTables reads nat and filter of a family with the real iptables-save.
func kernelTables(t *testing.T, ns string, f Family) map[Table]savedTable {
	t.Helper()
	bin := "iptables-save"
	if f == IPv6 {
		bin = "ip6tables-save"
	}
	out := map[Table]savedTable{}
	for _, table := range []Table{TableNAT, TableFilter} {
		st, err := parseSave([]byte(inNetns(t, ns, bin, "-t", string(table))), table)
		if err != nil {
			t.Fatal(err)
		}
		out[table] = st
	}
	return out
}

// assertKernelState checks that the kernel holds exactly our rules for
// portals, as iptables-save prints them, and each jump once, in order.
func assertKernelState(t *testing.T, ns string, r *Rules, portals []Portal) {
	t.Helper()
	got := kernelTables(t, ns, r.cfg.Family)
	want := r.desired(portals)
	for _, c := range renderedChains(want) {
		if !got[c.table].chains[c.name] {
			t.Errorf("%v %s/%s missing", r.cfg.Family, c.table, c.name)
		}
		if rules := got[c.table].rules[c.name]; !slices.Equal(rules, want[c.name]) {
			t.Errorf("%v %s/%s: %s", r.cfg.Family, c.table, c.name, firstDifference(rules, want[c.name]))
		}
	}
	for _, c := range unwantedBuckets(want, got) {
		t.Errorf("%v %s/%s left behind", r.cfg.Family, c.table, c.name)
	}
	for table, chains := range wantBuiltins {
		for chain, rules := range chains {
			if got := got[table].rules[chain]; !slices.Equal(got, rules) {
				t.Errorf("%v built-in %s/%s:\n got %q\nwant %q", r.cfg.Family, table, chain, got, rules)
			}
		}
	}
}

// firstDifference describes where got first differs from want, without
// printing chains of thousands of rules.
func firstDifference(got, want []string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	at := func(rules []string) string {
		if i < len(rules) {
			return rules[i]
		}
		return "(end)"
	}
	return fmt.Sprintf("%d rules, want %d; rule %d is\n got %q\nwant %q", len(got), len(want), i+1, at(got), at(want))
}

// assertKernelClean checks that nothing of ours is left in either family.
func assertKernelClean(t *testing.T, ns string) {
	t.Helper()
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		if dump := inNetns(t, ns, bin); strings.Contains(dump, "KUBE-") || strings.Contains(dump, "kube-userspace-proxy") {
			t.Errorf("%s still shows our rules:\n%s", bin, dump)
		}
	}
}

func TestKernelSyncRepairRestartCleanup(t *testing.T) {
	requireRealIptables(t)
	ns := newNetns(t)
	// A healthCheckNodePort's accept, limited to --nodeport-addresses in
	// IPv4: printed as rendered, cleaned up with the rest.
	healthCheck := Portal{Name: "default/web:http", Port: 30301, HealthCheck: true}
	families := []struct {
		cfg     Config
		portals []Portal
		cmd     string
	}{
		{Config{Family: IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("192.168.1.10"),
			NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}}, append(webPortals(), healthCheck), "iptables"},
		{Config{Family: IPv6, NodeIP: netip.MustParseAddr("fd00:1::10")}, append(dualStackPortals(), healthCheck), "ip6tables"},
	}
	for _, fam := range families {
		t.Run(fam.cfg.Family.String(), func(t *testing.T) {
			runner := newNSRunner(t, ns, fam.cfg.Family)
			r := New(runner, fam.cfg)

			syncOK(t, r, fam.portals)
			assertKernelState(t, ns, r, fam.portals)
			if n := runner.restores.Load(); n != 2 {
				t.Errorf("first sync ran %d restores, want 2 (filter, then nat)", n)
			}

			// Our rendering is byte for byte what iptables-save prints, so an
			// unchanged sync reads and writes nothing.
			runner.restores.Store(0)
			syncOK(t, r, fam.portals)
			if n := runner.restores.Load(); n != 0 {
				t.Errorf("unchanged sync ran %d restores, want 0", n)
			}
			if len(r.printed) != 0 {
				t.Errorf("kernel printed rules differently from our rendering: %+v", r.printed)
			}

			// Someone deletes a rule, adds a stranger, duplicates jumps.
			ipt := fam.cmd
			inNetns(t, ns, ipt, "-t", "nat", "-D", ChainPortalsContainer, "1")
			inNetns(t, ns, ipt, "-t", "nat", "-A", ChainPortalsHost, "-p", "tcp", "-j", "ACCEPT")
			inNetns(t, ns, ipt, "-t", "filter", "-F", ChainProxyPortGuard)
			for _, j := range jumps {
				inNetns(t, ns, append([]string{ipt, "-t", string(j.table), "-A", j.from}, j.spec()...)...)
			}
			syncOK(t, r, fam.portals)
			assertKernelState(t, ns, r, fam.portals)

			// The guard chain deleted, the non-local jump duplicated on top:
			// the guard's jump goes in with its chain's restore, and the
			// non-local jump is put back below it there, not counted
			// against a chain that does not hold the guard's jump yet.
			inNetns(t, ns, append([]string{ipt, "-t", "filter", "-D", "INPUT"}, jumpTo(ChainProxyPortGuard).spec()...)...)
			inNetns(t, ns, ipt, "-t", "filter", "-F", ChainProxyPortGuard)
			inNetns(t, ns, ipt, "-t", "filter", "-X", ChainProxyPortGuard)
			inNetns(t, ns, append([]string{ipt, "-t", "filter", "-I", "INPUT", "1"}, jumpTo(ChainNodePortNonLocal).spec()...)...)
			syncOK(t, New(runner, fam.cfg), fam.portals)
			assertKernelState(t, ns, r, fam.portals)

			// A restart (new Rules, nothing remembered) with one Service
			// fewer converges to exactly one copy of each rule.
			fewer := fam.portals[1:]
			restarted := New(runner, fam.cfg)
			syncOK(t, restarted, fewer)
			assertKernelState(t, ns, restarted, fewer)

			// All Services removed: nothing but empty chains and the jumps.
			syncOK(t, restarted, nil)
			assertKernelState(t, ns, restarted, nil)
		})
	}

	t.Run("CleanupAll", func(t *testing.T) {
		th := startNSThread(t, ns)
		for range 2 { // the second run finds nothing and must not fail
			var err error
			th.do(func() { err = CleanupAll() })
			if err != nil {
				t.Fatalf("CleanupAll: %v", err)
			}
			assertKernelClean(t, ns)
		}
	})
}

func TestKernelCleanupRemovesForeignShapedJumps(t *testing.T) {
	requireRealIptables(t)
	ns := newNetns(t)
	runner := newNSRunner(t, ns, IPv4)
	syncOK(t, New(runner, Config{Family: IPv4}), webPortals())
	// The legacy userspace proxier's jump, with its own comment.
	inNetns(t, ns, "iptables", "-t", "nat", "-I", "PREROUTING", "1", "-m", "comment", "--comment",
		"handle ClusterIPs; NOTE: this must be before the NodePort rules", "-j", ChainPortalsContainer)
	inNetns(t, ns, "iptables", "-t", "filter", "-A", "INPUT", "-p", "tcp", "-j", "ACCEPT")
	if err := Cleanup(runner); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	assertKernelClean(t, ns)
	if got := kernelTables(t, ns, IPv4)[TableFilter].rules["INPUT"]; !slices.Equal(got, []string{"-p tcp -j ACCEPT"}) {
		t.Errorf("foreign INPUT rules = %q, want them kept", got)
	}
}

// One Service changed among many goes to the kernel as a delta (-D and -I
// lines only, through the real iptables-restore --noflush) that leaves
// exactly the rules a full rewrite would; drift Update cannot see is
// repaired by the next Sync.
func TestKernelUpdateOneAmongMany(t *testing.T) {
	requireRealIptables(t)
	ns := newNetns(t)
	runner := newNSRunner(t, ns, IPv4)
	cfg := Config{Family: IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("192.168.1.10"),
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	r := New(runner, cfg)
	const n = 2000
	portals := manyPortals(n)
	start := time.Now()
	syncOK(t, r, portals)
	full := time.Since(start)
	assertKernelState(t, ns, r, portals)

	steps := []struct {
		name   string
		change func([]Portal) []Portal
	}{
		{"port moved", func(ps []Portal) []Portal { ps[2*1234].Port = 81; return ps }},
		{"service added", func(ps []Portal) []Portal {
			return append(ps, Portal{Name: "bench/new:http", Protocol: TCP, IP: netip.MustParseAddr("10.97.0.1"), Port: 80, ProxyPort: 19999},
				Portal{Name: "bench/new:http", Protocol: TCP, IP: netip.MustParseAddr("203.0.113.1"), Port: 80, ProxyPort: 19998, ClusterProxyPort: 19999})
		}},
		{"service removed", func(ps []Portal) []Portal { return slices.Delete(ps, 2*77, 2*77+2) }},
		{"proxy port moved", func(ps []Portal) []Portal { ps[2*500].ProxyPort, ps[2*500+1].ProxyPort = 19997, 19997; return ps }},
	}
	for _, step := range steps {
		portals = step.change(slices.Clone(portals))
		before := runner.restores.Load()
		start := time.Now()
		if err := r.Update(portals); err != nil {
			t.Fatalf("%s: Update: %v", step.name, err)
		}
		took := time.Since(start)
		assertKernelState(t, ns, r, portals)
		if restores := runner.restores.Load() - before; restores != 1 {
			t.Errorf("%s: %d restores, want 1", step.name, restores)
		}
		t.Logf("%s: Update %v (full Sync of %d services %v)", step.name, took, n, full)
	}

	// A rule deleted by hand: Update of another Service does not notice,
	// the periodic Sync puts it back.
	inNetns(t, ns, "iptables", "-t", "nat", "-D", ChainPortalsHost, "1")
	portals[2*10].Port = 82
	if err := r.Update(portals); err != nil {
		t.Fatal(err)
	}
	got := kernelTables(t, ns, IPv4)[TableNAT].rules[ChainPortalsHost]
	if want := r.desired(portals)[ChainPortalsHost]; len(got) != len(want)-1 {
		t.Fatalf("after Update the host chain holds %d rules, want %d (one deleted by hand)", len(got), len(want)-1)
	}
	syncOK(t, r, portals)
	assertKernelState(t, ns, r, portals)

	// The rule a delta must delete was deleted by hand: the restore fails
	// and Update rewrites in full. bench/new (its portals are the last
	// two) sorts first in its bucket.
	inNetns(t, ns, "iptables", "-t", "nat", "-D", bucketChain(ChainPortalsContainer, int(bucketOf("bench/new:http"))), "1")
	portals = portals[:len(portals)-2]
	before := runner.restores.Load()
	if err := r.Update(portals); err != nil {
		t.Fatal(err)
	}
	assertKernelState(t, ns, r, portals)
	if n := runner.restores.Load() - before; n < 2 {
		t.Errorf("the refused delta was not followed by a full rewrite (%d restores)", n)
	}

	// Down to 100 Services: the chains leave buckets, whose chains go.
	few := portals[:200]
	if err := r.Update(few); err != nil {
		t.Fatal(err)
	}
	assertKernelState(t, ns, r, few)
	// And back up, then everything removed by Cleanup.
	if err := r.Update(portals); err != nil {
		t.Fatal(err)
	}
	assertKernelState(t, ns, r, portals)
	if err := Cleanup(runner); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	assertKernelClean(t, ns)
}

// The legacy kube-proxy's jumps into our chains (its own comments), left
// on a node migrated in place, are removed by the sync beside ours: they
// stayed as a second way into each chain (iptables audit). Real iptables,
// so the saved spelling of the legacy rules is the kernel's.
func TestKernelSyncRemovesLegacyJumps(t *testing.T) {
	requireRealIptables(t)
	ns := newNetns(t)
	runner := newNSRunner(t, ns, IPv4)
	syncOK(t, New(runner, Config{Family: IPv4}), webPortals())
	inNetns(t, ns, "iptables", "-t", "nat", "-A", "PREROUTING", "-m", "comment", "--comment",
		"handle ClusterIPs; NOTE: this must be before the NodePort rules", "-j", ChainPortalsContainer)
	inNetns(t, ns, "iptables", "-t", "nat", "-A", "OUTPUT", "-m", "addrtype", "--dst-type", "LOCAL", "-m", "comment", "--comment",
		"handle service NodePorts; NOTE: this must be the last rule in the chain", "-j", ChainNodePortHost)
	inNetns(t, ns, "iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "-j", "RETURN") // foreign: stays
	// Another tool's jumps into our chains stay too: every sync removed
	// them, silently (iptables interplay audit).
	inNetns(t, ns, "iptables", "-t", "nat", "-A", "PREROUTING", "-i", "cni0", "-m", "comment", "--comment", "cni: pods", "-j", ChainPortalsContainer)
	inNetns(t, ns, "iptables", "-t", "nat", "-I", "OUTPUT", "1", "-o", "lo", "-p", "udp", "-j", ChainPortalsHost)
	syncOK(t, New(runner, Config{Family: IPv4}), webPortals())
	nat := kernelTables(t, ns, IPv4)[TableNAT]
	for chain, want := range map[string][]string{
		"PREROUTING": {jumpLine(ChainPortalsContainer), jumpLine(ChainNodePortContainer), "-p tcp -j RETURN",
			`-i cni0 -m comment --comment "cni: pods" -j ` + ChainPortalsContainer},
		// A rule put above ours stays above it (never reordered).
		"OUTPUT": {"-o lo -p udp -j " + ChainPortalsHost, jumpLine(ChainPortalsHost), jumpLine(ChainNodePortHost)},
	} {
		if got := nat.rules[chain]; !slices.Equal(got, want) {
			t.Errorf("nat %s:\n got %q\nwant %q", chain, got, want)
		}
	}
}

// A first Sync's restore killed by a signal after its COMMIT (systemd's
// stop signals every process of the unit; an OOM kill) is not run again:
// its jump lines into the built-in chains (-I INPUT 1 ...), which no
// restore flushes, put a second copy of every jump in, and Sync returned
// nil. Failed, the next Sync reads the kernel back and writes the rest.
func TestKernelFirstSyncSignalledAfterCommitIsNotRunAgain(t *testing.T) {
	requireRealIptables(t)
	real, err := exec.LookPath("iptables-restore")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	armed := filepath.Join(dir, "armed")
	wrapper := fmt.Sprintf("#!/bin/sh\n%s \"$@\"\nrc=$?\nif [ -e %s ]; then rm -f %[2]s; kill -TERM $$; sleep 5; fi\nexit $rc\n", real, armed)
	if err := os.WriteFile(filepath.Join(dir, "iptables-restore"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	ns := newNetns(t)
	r := New(newNSRunner(t, ns, IPv4), Config{Family: IPv4, BindAddress: netip.IPv4Unspecified(),
		NodeIP: netip.MustParseAddr("192.168.1.10"), ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})
	portals := manyPortals(10)
	if err := os.WriteFile(armed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = r.Sync(portals)
	if _, serr := os.Stat(armed); !os.IsNotExist(serr) {
		t.Fatalf("the restore was not signalled: %v", serr)
	}
	t.Logf("the signalled Sync: %v", err)
	for table, saved := range kernelTables(t, ns, IPv4) {
		for chain := range wantBuiltins[table] {
			for _, rule := range saved.rules[chain] {
				if n := countRule(saved.rules[chain], rule); n > 1 {
					t.Fatalf("built-in %s/%s holds %d copies of %q after the signalled Sync (%v)", table, chain, n, rule, err)
				}
			}
		}
	}
	syncOK(t, r, portals)
	assertKernelState(t, ns, r, portals)
}

// An Update whose iptables-restore is killed by a signal after its COMMIT
// (systemd's stop signals every process of the unit; an OOM kill) is not
// run again: its -I lines, which flush no chain, inserted every new rule a
// second time, and Update said nothing. The copy left when the Service
// went kept its portal (a DNAT to a proxy port another Service may take)
// until the next full Sync. Failed, the delta is rewritten in full.
func TestKernelUpdateSignalledAfterCommitIsNotRunAgain(t *testing.T) {
	requireRealIptables(t)
	// iptables-restore that does its work, then is killed while armed.
	real, err := exec.LookPath("iptables-restore")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	armed := filepath.Join(dir, "armed")
	wrapper := fmt.Sprintf("#!/bin/sh\n%s \"$@\"\nrc=$?\nif [ -e %s ]; then rm -f %[2]s; kill -TERM $$; sleep 5; fi\nexit $rc\n", real, armed)
	if err := os.WriteFile(filepath.Join(dir, "iptables-restore"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	ns := newNetns(t)
	runner := newNSRunner(t, ns, IPv4)
	cfg := Config{Family: IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("192.168.1.10"),
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	r := New(runner, cfg)
	portals := manyPortals(10)
	syncOK(t, r, portals)
	assertKernelState(t, ns, r, portals)

	if err := os.WriteFile(armed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	added := append(slices.Clone(portals), Portal{Name: "bench/new:http", Protocol: TCP,
		IP: netip.MustParseAddr("10.97.0.1"), Port: 80, ProxyPort: 19999})
	if err := r.Update(added); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if _, err := os.Stat(armed); !os.IsNotExist(err) {
		t.Fatalf("the restore was not signalled: %v", err)
	}
	assertKernelState(t, ns, r, added)
	// The Service goes: no rule of it is left.
	if err := r.Update(portals); err != nil {
		t.Fatalf("Update: %v", err)
	}
	assertKernelState(t, ns, r, portals)
}
