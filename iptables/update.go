package iptables

import (
	"bytes"
	"fmt"
	"strconv"

	"k8s.io/klog/v2"
)

// Update makes the kernel hold the rules for portals by writing only what
// changed since the last successful write: one iptables-restore --noflush,
// deleting the rules that went (-D by their text) and inserting the new
// ones at their place (-I CHAIN POS). It reads nothing back and leaves the jump rules alone, so it repairs nothing a
// stranger changed: that is Sync's job, which the proxier runs
// periodically. Update runs Sync instead when it does not know what the
// chains hold (first call, or after any failure), and when a delta fails
// (a rule to delete was gone, say) it falls back to Sync at once.
func (r *Rules) Update(portals []Portal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.startCount()()
	if r.have == nil {
		return r.syncLocked(portals)
	}
	r.lastRead = nil // it would not show what this writes
	want := r.desired(portals)
	deltas := make([]chainDelta, 0, len(ownedChains))
	for _, c := range renderedChains(want) {
		if !hasChain(r.have, c.name) { // a new bucket chain
			deltas = append(deltas, chainDelta{chain: c, rewrite: true})
		} else if d := diffChain(c, r.have[c.name], want[c.name]); !d.empty() {
			deltas = append(deltas, d)
		}
	}
	for _, c := range renderedChains(r.have) {
		if !hasChain(want, c.name) { // a bucket chain no longer wanted
			deltas = append(deltas, chainDelta{chain: c, drop: true})
		}
	}
	if len(deltas) == 0 {
		return nil
	}
	// One restore, filter first: iptables-restore commits each table at its
	// COMMIT (legacy) or all at the end (nft), and stops at the first
	// failure, so a portal is never in force before its guard. Most of its
	// cost is iptables-nft fetching every rule of each chain a -D or -I
	// edits (measured: 10 ms for a delta in a 150-rule chain, 110-170 ms in
	// a 10,000-rule one of the same table), which is why large chains are
	// split into buckets (chains.go).
	data := append(deltaInput(TableFilter, deltas, want), deltaInput(TableNAT, deltas, want)...)
	// Its -D and -I lines make Restore run it once (rewritesWholeChains):
	// killed by a signal after its COMMIT and run again, it inserted its
	// rules twice; failed, it is rewritten in full below.
	if err := r.runner.Restore(data); err != nil {
		klog.ErrorS(err, "Incremental iptables update failed; rewriting our chains in full", "family", r.cfg.Family)
		r.stats.partialFailures.Add(1)
		r.have = nil
		return r.syncLocked(portals)
	}
	for _, d := range deltas {
		switch {
		case d.rewrite:
			r.wrote.add(d.chain.table, len(want[d.chain.name]))
		case !d.drop:
			r.wrote.add(d.chain.table, len(d.ins))
		}
		if d.drop {
			delete(r.have, d.chain.name)
		} else {
			r.have[d.chain.name] = want[d.chain.name]
			r.written[d.chain.name] = true
		}
	}
	r.countHave()
	klog.V(2).InfoS("Updated iptables chains", "family", r.cfg.Family, "changes", deltaSummary(deltas))
	return nil
}

// chainDelta turns one chain's old rules into its new ones: delete the
// rules in del, then insert each of ins at its position (1-based, counted
// in the new chain, so inserting in order lands every rule in place). When
// the change cannot be written as such a delta (rules kept but reordered)
// or is most of the chain, rewrite says to flush and refill it instead;
// drop says to delete the chain (a bucket no longer wanted).
type chainDelta struct {
	chain   ownedChain
	del     []string
	ins     []insertion
	rewrite bool
	drop    bool
}

type insertion struct {
	pos  int
	rule string
}

func (d chainDelta) empty() bool { return !d.rewrite && !d.drop && len(d.del) == 0 && len(d.ins) == 0 }

// diffChain computes the delta from have to want. Rules within one chain
// are unique (desired drops repeats), so a rule's text is its identity.
// Only the span between the common head and tail is compared, so one
// changed Service among 10,000 costs two scans of string headers (the
// rules of unchanged portals are the same cached strings) and a few map
// entries.
func diffChain(c ownedChain, have, want []string) chainDelta {
	d := chainDelta{chain: c}
	head := 0
	for head < len(have) && head < len(want) && have[head] == want[head] {
		head++
	}
	tail := 0
	for tail < len(have)-head && tail < len(want)-head && have[len(have)-1-tail] == want[len(want)-1-tail] {
		tail++
	}
	oldMid, newMid := have[head:len(have)-tail], want[head:len(want)-tail]
	if len(oldMid) == 0 && len(newMid) == 0 {
		return d
	}
	// A delta costs the kernel a lookup per line; past half the chain a
	// flush and refill is as cheap and simpler.
	if len(oldMid)+len(newMid) > len(want)/2+8 {
		d.rewrite = true
		return d
	}
	inNew := make(map[string]struct{}, len(newMid))
	for _, rule := range newMid {
		inNew[rule] = struct{}{}
	}
	inOld := make(map[string]struct{}, len(oldMid))
	var kept []string
	for _, rule := range oldMid {
		inOld[rule] = struct{}{}
		if _, ok := inNew[rule]; ok {
			kept = append(kept, rule)
		} else {
			d.del = append(d.del, rule)
		}
	}
	k := 0
	for i, rule := range newMid {
		if _, ok := inOld[rule]; !ok {
			d.ins = append(d.ins, insertion{pos: head + i + 1, rule: rule})
			continue
		}
		if kept[k] != rule { // kept rules changed order: not a delta
			return chainDelta{chain: c, rewrite: true}
		}
		k++
	}
	return d
}

// deltaInput prints the deltas of one table as iptables-restore --noflush
// input, or returns nil when the table has none: first the chains to
// rewrite or drop are declared (which creates or flushes them), then the
// rule lines, then the dropped chains are deleted, when nothing jumps to
// them any more.
func deltaInput(table Table, deltas []chainDelta, want chainRules) []byte {
	var b bytes.Buffer
	var these []chainDelta
	for _, d := range deltas {
		if d.chain.table == table {
			these = append(these, d)
		}
	}
	if len(these) == 0 {
		return nil
	}
	b.WriteString("*" + string(table) + "\n")
	for _, d := range these {
		if d.rewrite || d.drop {
			b.WriteString(":" + d.chain.name + " - [0:0]\n")
		}
	}
	for _, d := range these {
		name := d.chain.name
		if d.rewrite {
			for _, rule := range want[name] {
				b.WriteString("-A " + name + " " + rule + "\n")
			}
			continue
		}
		for _, rule := range d.del {
			b.WriteString("-D " + name + " " + rule + "\n")
		}
		for _, in := range d.ins {
			b.WriteString("-I " + name + " " + strconv.Itoa(in.pos) + " " + in.rule + "\n")
		}
	}
	for _, d := range these {
		if d.drop {
			b.WriteString("-X " + d.chain.name + "\n")
		}
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// deltaSummary is the log's view of a set of deltas.
func deltaSummary(deltas []chainDelta) []string {
	out := make([]string, len(deltas))
	for i, d := range deltas {
		switch {
		case d.drop:
			out[i] = d.chain.name + " deleted"
		case d.rewrite:
			out[i] = d.chain.name + " rewritten"
		default:
			out[i] = fmt.Sprintf("%s -%d +%d", d.chain.name, len(d.del), len(d.ins))
		}
	}
	return out
}
