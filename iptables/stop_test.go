package iptables

import (
	"slices"
	"strings"
	"testing"
)

// natState is every nat chain of ours with its rules, to show that a stop
// and a restart leave the portals as they were.
func natState(fake *FakeRunner) map[string][]string {
	out := map[string][]string{}
	for _, c := range fake.Chains(TableNAT) {
		out[c] = fake.Rules(TableNAT, c)
	}
	return out
}

func equalState(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// While no proxy serves (stopped, or started and not yet synced), traffic a
// portal sends to a proxy port meets the reject chain, not an accept: a
// local user who binds the port must not receive it. Stop keeps the
// portals (a restart rewrites none) and the guard; the successor's first
// Sync puts the accepts back.
func TestStopRejectsPortalTrafficUntilTheNextSync(t *testing.T) {
	for _, bucketAbove := range []int{defaultBucketAbove, 1} {
		fake := NewFakeRunner(IPv4)
		r := New(fake, testConfig)
		r.SetBucketAbove(bucketAbove)
		syncOK(t, r, webPortals())
		nat := natState(fake)
		guard := fake.Rules(TableFilter, ChainProxyPortGuard)
		wantReject := []string{
			"-p tcp -m tcp --dport 40001 -j REJECT --reject-with tcp-reset",
			"-p tcp -m tcp --dport 40003 -j REJECT --reject-with tcp-reset",
			"-p udp -m udp --dport 40002 -j REJECT --reject-with icmp-port-unreachable",
		}
		if bucketAbove == defaultBucketAbove {
			if got := fake.Rules(TableFilter, ChainProxyPortReject); !slices.Equal(got, wantReject) {
				t.Errorf("reject chain:\n got %q\nwant %q", got, wantReject)
			}
		}

		fake.ResetCalls()
		if err := r.Stop(); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if n := fake.CallsOf("Restore"); n != 1 || len(fake.Calls()) != 1 {
			t.Errorf("Stop's calls: %q, want one restore", fake.Calls())
		}
		for _, c := range []string{ChainPortalsNonLocal, ChainNodePortNonLocal} {
			if got := fake.Rules(TableFilter, c); len(got) != 0 {
				t.Errorf("buckets above %d: after Stop %s holds %q, want nothing", bucketAbove, c, got)
			}
		}
		if got := natState(fake); !equalState(got, nat) {
			t.Errorf("buckets above %d: Stop changed the nat chains:\n got %q\nwant %q", bucketAbove, got, nat)
		}
		if got := fake.Rules(TableFilter, ChainProxyPortGuard); !slices.Equal(got, guard) {
			t.Errorf("Stop changed the guard: got %q, want %q", got, guard)
		}
		if got := fake.Rules(TableFilter, "INPUT"); !slices.Equal(got, wantBuiltins[TableFilter]["INPUT"]) {
			t.Errorf("INPUT after Stop: got %q, want %q", got, wantBuiltins[TableFilter]["INPUT"])
		}

		// The successor: its first Sync writes the accepts and no portal.
		fake.ResetCalls()
		next := New(fake, testConfig)
		next.SetBucketAbove(bucketAbove)
		syncOK(t, next, webPortals())
		assertState(t, fake, next, webPortals())
		for _, w := range fake.Writes() {
			if strings.Contains(string(w), "*nat") {
				t.Errorf("buckets above %d: the restart rewrote nat rules:\n%s", bucketAbove, w)
			}
		}
	}
}

// An upgrade from a build without the reject chain: the first Sync adds the
// chain and its jump right below KUBE-PORTALS-NON-LOCAL and rewrites no
// portal; --cleanup removes them again.
func TestUpgradeAddsTheRejectChainWithoutRewritingPortals(t *testing.T) {
	fake := NewFakeRunner(IPv4)
	syncOK(t, New(fake, testConfig), webPortals())
	// What the previous build left: no reject chain, no jump to it.
	j := jumpTo(ChainProxyPortReject)
	if err := fake.DeleteRule(j.table, j.from, j.spec()...); err != nil {
		t.Fatal(err)
	}
	if err := fake.DeleteChain(TableFilter, ChainProxyPortReject); err != nil {
		t.Fatal(err)
	}
	nat := natState(fake)
	fake.ResetCalls()
	r := New(fake, testConfig)
	syncOK(t, r, webPortals())
	assertState(t, fake, r, webPortals())
	if got := natState(fake); !equalState(got, nat) {
		t.Errorf("the upgrade changed the nat chains:\n got %q\nwant %q", got, nat)
	}
	if err := Cleanup(fake); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if slices.Contains(fake.Chains(TableFilter), ChainProxyPortReject) || slices.ContainsFunc(fake.Rules(TableFilter, "INPUT"), func(r string) bool { return strings.Contains(r, ChainProxyPortReject) }) {
		t.Errorf("Cleanup left the reject chain: chains %q, INPUT %q", fake.Chains(TableFilter), fake.Rules(TableFilter, "INPUT"))
	}
}

// Stop before this process's first sync takes back the accepts a
// predecessor left (it crashed, or its stop failed) and creates nothing on
// a node without our chains.
func TestStopBeforeAnySync(t *testing.T) {
	fake := NewFakeRunner(IPv4)
	if err := New(fake, testConfig).Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if got := fake.CallsOf("Restore"); got != 0 || slices.ContainsFunc(fake.Chains(TableFilter), func(c string) bool { return !isBuiltin(TableFilter, c) }) {
		t.Errorf("Stop on a node without our chains: %d restores, chains %q", got, fake.Chains(TableFilter))
	}
	syncOK(t, New(fake, testConfig), webPortals())
	if err := New(fake, testConfig).Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for _, c := range []string{ChainPortalsNonLocal, ChainNodePortNonLocal} {
		if got := fake.Rules(TableFilter, c); len(got) != 0 {
			t.Errorf("after a fresh process's Stop %s holds %q, want nothing", c, got)
		}
	}
}

// An upgrade on a backend that prints rules in another spelling than ours
// (TestSyncToleratesDifferentPrinting): the jumps before the reject
// chain's cannot be located by their text, and a first jump whose
// predecessor is not found went to the top of INPUT: above both accepts,
// where it refused every portal and NodePort connection while the proxy
// ran. A refusing jump goes last instead.
func TestUpgradeRejectJumpBelowAcceptsInAnotherSpelling(t *testing.T) {
	fake := NewFakeRunner(IPv4)
	fake.Normalize = func(rule string) string { return strings.ReplaceAll(rule, " -j ", "  -j ") }
	must(t, fake.AppendRule(TableFilter, "INPUT", "-p", "tcp", "-j", "ACCEPT"))
	r0 := New(fake, testConfig)
	syncOK(t, r0, webPortals())
	// What the previous build left: no reject chain, no jump to it.
	for _, l := range fake.Rules(TableFilter, "INPUT") {
		if strings.Contains(l, ChainProxyPortReject) {
			args, _ := splitRule(l)
			must(t, fake.DeleteRule(TableFilter, "INPUT", args...))
		}
	}
	must(t, fake.DeleteChain(TableFilter, ChainProxyPortReject))
	syncOK(t, New(fake, testConfig), webPortals())
	in := fake.Rules(TableFilter, "INPUT")
	at := func(chain string) int {
		return slices.IndexFunc(in, func(l string) bool { return strings.HasSuffix(l, " "+chain) })
	}
	rej, acc, np := at(ChainProxyPortReject), at(ChainPortalsNonLocal), at(ChainNodePortNonLocal)
	if rej < 0 || acc < 0 || np < 0 || rej < acc || rej < np {
		t.Errorf("INPUT %q: reject jump at %d, accept jumps at %d (portals) and %d (NodePorts): want it below both", in, rej, acc, np)
	}
}

// A stop whose process never synced (every sync fails while iptables-save
// cannot print the filter table: TestSyncUnprintableTableAddsNoJumps)
// reads the kernel to find the accepts, and such a table read as holding
// none of our chains: the accepts stayed after the stop, so a local process
// that bound a proxy port got the Services' traffic. They are looked for
// one by one there, as a sync does.
func TestStopFlushesAcceptsOfAnUnprintableTable(t *testing.T) {
	fake := NewFakeRunner(IPv4)
	syncOK(t, New(fake, testConfig), webPortals())
	fake.Unprintable = map[Table]bool{TableFilter: true}
	if err := New(fake, testConfig).Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for _, c := range []string{ChainPortalsNonLocal, ChainNodePortNonLocal} {
		if got := fake.Rules(TableFilter, c); len(got) != 0 {
			t.Errorf("after a stop over an unprintable filter table %s holds %q, want nothing", c, got)
		}
	}
}
