package iptables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// writtenRules counts, per table, the rules the calls since the last
// ResetCalls added: the -A and -I lines of every restore that went through
// and every iptables -I/-A (a jump). kube-proxy's
// sync_proxy_rules_iptables_last counts the rules of its restore input.
func writtenRules(fake *FakeRunner) (filter, nat int) {
	count := func(table Table) {
		if table == TableFilter {
			filter++
		} else {
			nat++
		}
	}
	for _, w := range fake.Writes() {
		var table Table
		for line := range strings.Lines(string(w)) {
			switch {
			case strings.HasPrefix(line, "*"):
				table = Table(strings.TrimSpace(line[1:]))
			case strings.HasPrefix(line, "-A "), strings.HasPrefix(line, "-I "):
				count(table)
			}
		}
	}
	for _, c := range fake.Calls() {
		if f := strings.Fields(c); len(f) > 1 && (f[0] == "InsertRule" || f[0] == "AppendRule") {
			count(Table(f[1]))
		}
	}
	return filter, nat
}

// LastSyncRuleCounts is kube-proxy's sync_proxy_rules_iptables_last: the
// rules the last Sync or Update wrote, per table. A partial write (Update's
// delta) writes fewer than the table holds; a sync that finds nothing to
// change writes none.
func TestLastSyncRuleCounts(t *testing.T) {
	fake := NewFakeRunner(IPv4)
	r := New(fake, testConfig)
	check := func(step string) (filter, nat int) {
		t.Helper()
		wantFilter, wantNat := writtenRules(fake)
		filter, nat = r.LastSyncRuleCounts()
		if filter != wantFilter || nat != wantNat {
			t.Errorf("%s: last sync wrote filter %d, nat %d; want %d, %d (calls %q)", step, filter, nat, wantFilter, wantNat, fake.Calls())
		}
		fake.ResetCalls()
		return filter, nat
	}

	syncOK(t, r, webPortals())
	filter, nat := check("first sync")
	heldFilter, heldNat := r.RuleCounts()
	if filter < heldFilter || nat < heldNat {
		t.Errorf("first sync wrote filter %d, nat %d: fewer than the tables hold (%d, %d)", filter, nat, heldFilter, heldNat)
	}

	syncOK(t, r, webPortals())
	if filter, nat := check("a sync with nothing to change"); filter != 0 || nat != 0 {
		t.Errorf("a sync with nothing to change wrote filter %d, nat %d", filter, nat)
	}

	newNodePort := Portal{Name: "default/api:https", Protocol: TCP, Port: 30443, NodePort: true, ProxyPort: 40100}
	portals := append(webPortals(), newNodePort)
	updateOK(t, r, portals)
	filter, nat = check("an update adding a NodePort Service")
	if heldFilter, heldNat := r.RuleCounts(); filter == 0 || nat == 0 || filter >= heldFilter || nat >= heldNat {
		t.Errorf("a partial update wrote filter %d, nat %d; want some, fewer than the tables hold (%d, %d)", filter, nat, heldFilter, heldNat)
	}

	updateOK(t, r, portals)
	if filter, nat := check("an update with nothing to change"); filter != 0 || nat != 0 {
		t.Errorf("an update with nothing to change wrote filter %d, nat %d", filter, nat)
	}

	// Someone deleted a jump and a rule of ours: the periodic sync puts
	// them back (the jump with iptables -I, the chain by a restore).
	args, _ := splitRule(fake.Rules(TableNAT, ChainPortalsHost)[0])
	must(t, fake.DeleteRule(TableNAT, ChainPortalsHost, args...))
	must(t, fake.DeleteRule(TableNAT, "OUTPUT", jumpTo(ChainPortalsHost).spec()...))
	fake.ResetCalls()
	syncOK(t, r, portals)
	if _, nat := check("a sync repairing a chain and its jump"); nat == 0 {
		t.Error("a sync repairing a chain and its jump wrote no nat rule")
	}

	// An update whose delta fails (a rule it deletes is gone) rewrites in
	// full: the count is that rewrite's.
	i := slices.IndexFunc(fake.Rules(TableNAT, ChainNodePortContainer), func(rule string) bool { return strings.Contains(rule, "30443") })
	if i < 0 {
		t.Fatalf("no rule of the NodePort 30443 in %s: %q", ChainNodePortContainer, fake.Rules(TableNAT, ChainNodePortContainer))
	}
	args, _ = splitRule(fake.Rules(TableNAT, ChainNodePortContainer)[i])
	must(t, fake.DeleteRule(TableNAT, ChainNodePortContainer, args...))
	fake.ResetCalls()
	updateOK(t, r, webPortals())
	if _, nat := check("an update falling back to a full sync"); nat == 0 {
		t.Error("an update falling back to a full sync wrote no nat rule")
	}

	// A failed nat write: the filter rules that went in (their own
	// restore, first) are counted, the refused nat ones are not.
	fake.SetError("Restore nat", errTest)
	moved := append(webPortals(), Portal{Name: "default/db:pg", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.99"), Port: 5432, ProxyPort: 40200})
	if err := r.Sync(moved); err == nil {
		t.Fatal("Sync succeeded with the nat restore failing")
	}
	fake.SetError("Restore nat", nil)
	if filter, nat := check("a sync whose nat write failed"); filter == 0 || nat != 0 {
		t.Errorf("a sync whose nat write failed: filter %d, nat %d; want the filter rules written, no nat", filter, nat)
	}
}
