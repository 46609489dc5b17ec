package iptables

import "sync/atomic"

// ruleStats is what kube-proxy's iptables series report, kept in atomics
// apart from Rules.mu so that a metrics scrape never waits for a sync (a
// first sync at 10,000 Services holds mu for a second).
type ruleStats struct {
	filter, nat         atomic.Int64
	lastFilter, lastNat atomic.Int64
	partialFailures     atomic.Uint64
	repairs             atomic.Uint64
}

// writeCount counts the rules one Sync or Update wrote per table (mu
// held): kube-proxy's sync_proxy_rules_iptables_last.
type writeCount struct{ filter, nat int64 }

// add counts n rules written into table.
func (w *writeCount) add(table Table, n int) {
	if table == TableFilter {
		w.filter += int64(n)
	} else {
		w.nat += int64(n)
	}
}

// startCount begins counting the rules a Sync or Update writes; the
// returned func publishes the count, whatever the call returns (mu held
// throughout).
func (r *Rules) startCount() func() {
	r.wrote = writeCount{}
	return func() {
		r.stats.lastFilter.Store(r.wrote.filter)
		r.stats.lastNat.Store(r.wrote.nat)
	}
}

// countHave records how many rules our chains hold per table, from r.have
// (mu held, r.have just set from a successful write or read-back).
func (r *Rules) countHave() {
	var filter, nat int64
	for _, c := range renderedChains(r.have) {
		if c.table == TableFilter {
			filter += int64(len(r.have[c.name]))
		} else {
			nat += int64(len(r.have[c.name]))
		}
	}
	r.stats.filter.Store(filter)
	r.stats.nat.Store(nat)
}

// RuleCounts returns how many rules our chains held in the filter and nat
// tables after the last successful write or verified read-back (kube-proxy's
// sync_proxy_rules_iptables_total); a failed write leaves the last counts.
func (r *Rules) RuleCounts() (filter, nat int) {
	return int(r.stats.filter.Load()), int(r.stats.nat.Load())
}

// LastSyncRuleCounts returns how many rules the last Sync or Update wrote
// into the filter and nat tables: kube-proxy's
// sync_proxy_rules_iptables_last. Those of its iptables-restore input that
// went through (a rewritten chain's rules, a delta's inserted ones, a jump
// into a chain of ours), not the -D and -X lines; nothing when it found
// nothing to change. kube-proxy rewrites its filter rules and the nat
// chains of changed Services at every sync, so its count is rarely 0.
func (r *Rules) LastSyncRuleCounts() (filter, nat int) {
	return int(r.stats.lastFilter.Load()), int(r.stats.lastNat.Load())
}

// Repairs counts the Syncs that rewrote chains of ours someone else had
// changed since the last sync that went through (another proxy's sync, a
// flush). The proxier then clears the conntrack entries those rules left
// NATed to ports none of its sockets holds.
func (r *Rules) Repairs() uint64 { return r.stats.repairs.Load() }

// PartialRestoreFailures counts Update's incremental restores that
// iptables-restore refused (each then fell back to a full rewrite):
// kube-proxy's sync_proxy_rules_iptables_partial_restore_failures_total.
func (r *Rules) PartialRestoreFailures() uint64 { return r.stats.partialFailures.Load() }
