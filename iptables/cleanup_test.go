package iptables

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// assertClean checks that fake holds only the built-in chains and the
// foreign rules given, per table/chain.
func assertClean(t *testing.T, fake *FakeRunner, foreign map[Table]map[string][]string) {
	t.Helper()
	for _, table := range []Table{TableNAT, TableFilter} {
		if got := fake.Chains(table); !slices.Equal(got, builtinChains[table]) {
			t.Errorf("%s chains = %q, want only built-ins %q", table, got, builtinChains[table])
		}
		for _, chain := range builtinChains[table] {
			if got, want := fake.Rules(table, chain), foreign[table][chain]; !slices.Equal(got, want) {
				t.Errorf("%s/%s = %q, want %q", table, chain, got, want)
			}
		}
	}
}

func TestCleanup(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, f *FakeRunner)
	}{
		{"nothing installed", func(*testing.T, *FakeRunner) {}},
		{"after sync", func(t *testing.T, f *FakeRunner) {
			syncOK(t, New(f, testConfig), webPortals())
		}},
		{"duplicate jumps", func(t *testing.T, f *FakeRunner) {
			syncOK(t, New(f, testConfig), webPortals())
			for _, j := range jumps {
				must(t, f.InsertRule(j.table, j.from, 1, j.spec()...))
			}
		}},
		{"jumps of another shape (legacy comments)", func(t *testing.T, f *FakeRunner) {
			syncOK(t, New(f, testConfig), webPortals())
			must(t, f.InsertRule(TableNAT, "PREROUTING", 1, "-m", "comment", "--comment", "handle ClusterIPs; NOTE: this must be before the NodePort rules", "-j", ChainPortalsContainer))
			must(t, f.AppendRule(TableFilter, "INPUT", "-m", "comment", "--comment", "Ensure that non-local NodePort traffic can flow", "-j", ChainNodePortNonLocal))
		}},
		{"another tool's goto (-g) into our chains", func(t *testing.T, f *FakeRunner) {
			syncOK(t, New(f, testConfig), webPortals())
			must(t, f.AppendRule(TableNAT, "PREROUTING", "-i", "cni0", "-p", "tcp", "-g", ChainPortalsContainer))
			must(t, f.AppendRule(TableFilter, "INPUT", "-m", "comment", "--comment", "-j", "-g", ChainProxyPortGuard))
		}},
		{"chains without jumps", func(t *testing.T, f *FakeRunner) {
			must(t, f.NewChain(TableNAT, ChainPortalsHost))
			must(t, f.NewChain(TableFilter, ChainProxyPortGuard))
		}},
	}
	foreign := map[Table]map[string][]string{
		TableNAT:    {"PREROUTING": {"-p tcp -j RETURN"}},
		TableFilter: {"INPUT": {"-p tcp -j ACCEPT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := NewFakeRunner(IPv4)
			must(t, fake.AppendRule(TableNAT, "PREROUTING", "-p", "tcp", "-j", "RETURN"))
			must(t, fake.AppendRule(TableFilter, "INPUT", "-p", "tcp", "-j", "ACCEPT"))
			tt.prepare(t, fake)
			if err := Cleanup(fake); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			assertClean(t, fake, foreign)
			if err := Cleanup(fake); err != nil {
				t.Fatalf("second Cleanup: %v", err)
			}
		})
	}
}

func TestCleanupGoesOnPastErrors(t *testing.T) {
	fake := NewFakeRunner(IPv6)
	syncOK(t, New(fake, Config{Family: IPv6}), dualStackPortals())
	boom := errors.New("boom")
	fake.Errors = map[string]error{"Save": boom}
	if err := Cleanup(fake); !errors.Is(err, boom) {
		t.Fatalf("Cleanup error = %v, want %v", err, boom)
	}
	// The jumps table alone was enough to unhook and delete our chains.
	fake.Errors = nil
	assertClean(t, fake, nil)
}

// --cleanup on a node without ip6tables succeeds, as running does there;
// a missing iptables (IPv4) is still an error.
func TestCleanupAllWithoutIPv6(t *testing.T) {
	v4 := NewFakeRunner(IPv4)
	syncOK(t, New(v4, testConfig), webPortals())
	missing := errors.New(`exec: "ip6tables": executable file not found in $PATH`)
	saved := newRunner
	t.Cleanup(func() { newRunner = saved })
	newRunner = func(f Family) (Runner, error) {
		if f == IPv6 {
			return nil, missing
		}
		return v4, nil
	}
	if err := CleanupAll(); err != nil {
		t.Fatalf("CleanupAll without ip6tables: %v", err)
	}
	assertClean(t, v4, nil)

	newRunner = func(Family) (Runner, error) { return nil, missing }
	if err := CleanupAll(); err == nil {
		t.Fatal("CleanupAll without iptables succeeded")
	}
}

// --cleanup on a node whose ip6tables runs but whose kernel has no IPv6 nat
// table (no ip6table_nat, IPv6 disabled at boot) cleans IPv4 and succeeds:
// the proxy ran without IPv6 there. One whose IPv6 nat table went away
// after a run (its module unloaded) still has our chains in the IPv6
// filter table, which it removes: it skipped the family, leaving the
// guard, accept and reject chains (and their jumps in INPUT) behind.
func TestCleanupAllWithoutIPv6NAT(t *testing.T) {
	for _, ranWithIPv6 := range []bool{false, true} {
		v4 := NewFakeRunner(IPv4)
		syncOK(t, New(v4, testConfig), webPortals())
		v6 := NewFakeRunner(IPv6)
		if ranWithIPv6 {
			syncOK(t, New(v6, Config{Family: IPv6}), dualStackPortals())
		}
		v6.RemoveTable(TableNAT)
		saved := newRunner
		newRunner = func(f Family) (Runner, error) {
			if f == IPv6 {
				return v6, nil
			}
			return v4, nil
		}
		err := CleanupAll()
		newRunner = saved
		if err != nil {
			t.Fatalf("CleanupAll without an IPv6 nat table (IPv6 rules left by a run: %v): %v", ranWithIPv6, err)
		}
		assertClean(t, v4, nil)
		if got := v6.Chains(TableFilter); !slices.Equal(got, builtinChains[TableFilter]) {
			t.Errorf("IPv6 filter chains = %q, want only built-ins %q", got, builtinChains[TableFilter])
		}
		for _, chain := range builtinChains[TableFilter] {
			if got := v6.Rules(TableFilter, chain); len(got) != 0 {
				t.Errorf("IPv6 filter/%s = %q, want no rules", chain, got)
			}
		}
	}
}

// Cleanup must remove another tool's jumps into our chains to delete them,
// and says so, rule by rule: it did it silently (iptables interplay audit).
func TestCleanupNamesForeignRulesItRemoves(t *testing.T) {
	logs := captureKlog(t)
	fake := NewFakeRunner(IPv4)
	syncOK(t, New(fake, testConfig), webPortals())
	must(t, fake.AppendRule(TableFilter, "FORWARD", "-m", "comment", "--comment", "my-cni", "-j", ChainProxyPortGuard))
	if err := Cleanup(fake); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	klog.Flush()
	if !strings.Contains(logs.String(), "Removed a rule that jumps to a chain of ours") || !strings.Contains(logs.String(), "my-cni") {
		t.Errorf("cleanup did not name the foreign rule it removed; log:\n%s", logs.String())
	}
}

// --cleanup says what it removed, and that it found nothing: it printed
// nothing either way.
func TestCleanupSaysWhatItRemoved(t *testing.T) {
	logs := captureKlog(t)
	fake := NewFakeRunner(IPv4)
	syncOK(t, New(fake, testConfig), webPortals())
	if err := Cleanup(fake); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if err := Cleanup(fake); err != nil {
		t.Fatalf("Cleanup again: %v", err)
	}
	klog.Flush()
	var said []string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, `"Cleaned up"`) {
			said = append(said, line)
		}
	}
	if len(said) != 2 {
		t.Fatalf("want one \"Cleaned up\" line per Cleanup, got %d; log:\n%s", len(said), logs.String())
	}
	if strings.Contains(said[0], "chainsDeleted=0") || strings.Contains(said[0], "jumpsDeleted=0") || !strings.Contains(said[0], `ipFamily="IPv4"`) {
		t.Errorf("first cleanup removed chains and jumps, but said: %s", said[0])
	}
	if !strings.Contains(said[1], "chainsDeleted=0 jumpsDeleted=0 errors=0") {
		t.Errorf("second cleanup found nothing, but said: %s", said[1])
	}
}

// captureKlog sends klog to the returned builder until the test ends.
func captureKlog(t *testing.T) *strings.Builder {
	var logs strings.Builder
	klog.SetOutput(&logs)
	klog.LogToStderr(false)
	t.Cleanup(func() { klog.SetOutput(nil); klog.LogToStderr(true) })
	return &logs
}

// lockHeldRunner fails its first `locked` ChainExists calls as under an
// xtables lock another process holds (<0: all).
type lockHeldRunner struct {
	*FakeRunner
	locked int
}

var errLockHeld = errors.New("running [iptables -t nat -S KUBE-PORTALS-CONTAINER 1 --wait 5]: exit status 4: Another app is currently holding the xtables lock. Stopped waiting after 5s")

func (r *lockHeldRunner) ChainExists(table Table, chain string) (bool, error) {
	if r.locked != 0 {
		r.locked--
		return false, errLockHeld
	}
	return r.FakeRunner.ChainExists(table, chain)
}

// --cleanup under a held xtables lock: a chain whose existence check
// failed was skipped (left behind, exit 1, a second run needed), and our
// own jumps into it, then found by the iptables-save scan, were logged as
// another tool's rules. The check is tried again while the lock is held
// (a bounded number of times); a lock that stays held fails the family at
// once, removing nothing; our jumps are never logged as another's.
func TestCleanupUnderHeldLock(t *testing.T) {
	t.Run("freed", func(t *testing.T) {
		logs := captureKlog(t)
		fake := NewFakeRunner(IPv4)
		syncOK(t, New(fake, testConfig), webPortals())
		if err := Cleanup(&lockHeldRunner{FakeRunner: fake, locked: 7}); err != nil {
			t.Fatalf("Cleanup with the lock freed after 7 checks: %v", err)
		}
		assertClean(t, fake, nil)
		klog.Flush()
		if strings.Contains(logs.String(), "Removed a rule that jumps to a chain of ours") {
			t.Errorf("our own jumps logged as another tool's:\n%s", logs.String())
		}
	})
	t.Run("held", func(t *testing.T) {
		fake := NewFakeRunner(IPv4)
		syncOK(t, New(fake, testConfig), webPortals())
		err := Cleanup(&lockHeldRunner{FakeRunner: fake, locked: -1})
		if !IsLockHeld(err) {
			t.Errorf("Cleanup under a lock held throughout = %v, want the lock's error", err)
		}
		if n := fake.CallsOf("DeleteRule") + fake.CallsOf("DeleteChain"); n != 0 {
			t.Errorf("%d removals tried under a held lock, want none", n)
		}
	})
	t.Run("our jumps found by the scan", func(t *testing.T) {
		logs := captureKlog(t)
		fake := NewFakeRunner(IPv4)
		syncOK(t, New(fake, testConfig), webPortals())
		fake.SetError("RuleExists", errors.New("boom")) // the jumps table finds nothing
		_ = Cleanup(fake)
		fake.SetError("RuleExists", nil)
		assertClean(t, fake, nil)
		klog.Flush()
		if strings.Contains(logs.String(), "Removed a rule that jumps to a chain of ours") {
			t.Errorf("our own jumps logged as another tool's:\n%s", logs.String())
		}
	})
}
