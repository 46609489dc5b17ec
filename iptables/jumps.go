package iptables

import (
	"fmt"
	"slices"
	"strconv"

	"k8s.io/klog/v2"
)

// builtinModel mirrors the rules of the built-in chains as saved, updated
// with every change ensureJumps makes, so insert positions are computed
// against what the chain will hold at that point and not a stale read.
type builtinModel map[string][]string // "table/chain" -> rules

func (m builtinModel) key(j jump) string { return string(j.table) + "/" + j.from }

// ensureJumps installs each jump of the jumps table exactly once, first
// jumps at the top in table order (each right below the previous one, so
// the guard stays above KUBE-NODEPORT-NON-LOCAL even when someone inserted
// a rule of their own at the top since). A jump printed exactly as we
// render it is found in the saved dump (no exec in the steady state);
// otherwise iptables -C decides, so a backend that prints differently
// never gets a second copy.
//
// A jump to one of fresh (our chains the dump did not hold) cannot exist
// yet, as no rule can name a missing chain: it is not checked, and it is
// returned as a line of its table's restore, which declares the chain
// first. A first start thus writes chains, contents and jumps in one
// iptables-restore per table; an exec per chain and two per jump cost the
// first sync at 10,000 Services 0.2 s. Once one edit of a built-in chain
// goes to the restore, every later edit of that chain follows it there,
// in order: positions are counted with the earlier edits applied.
func (r *Rules) ensureJumps(saved map[Table]savedTable, fresh map[string]bool, repairing bool) (map[Table][]string, error) {
	e := &jumpEditor{r: r, model: builtinModel{}, lines: map[Table][]string{}, deferred: map[string]bool{}, dropLater: map[string]bool{}, repairing: repairing}
	for _, j := range jumps {
		if _, ok := e.model[e.model.key(j)]; !ok {
			e.model[e.model.key(j)] = slices.Clone(saved[j.table].rules[j.from])
		}
	}
	prevFirst := map[string]string{} // per built-in chain: the last first jump placed
	for _, j := range jumps {
		key, line := e.model.key(j), joinRule(j.spec())
		prev := prevFirst[key]
		var err error
		count := countRule(e.model[key], line)
		if count > 1 && !fresh[j.to] {
			// Never ours (a restore --noflush of a saved ruleset): said as
			// what it is, where it was "Restoring a jump ... removed".
			klog.InfoS("Removing duplicate jumps into a chain of ours", "family", e.r.cfg.Family, "table", j.table, "chain", j.from, "to", j.to, "copies", count)
		}
		switch {
		case fresh[j.to]:
			if e.repairing {
				// The chain went with its jump (nat -F; -X): both come back.
				klog.InfoS("Restoring a jump into a chain of ours that another process removed", "family", e.r.cfg.Family, "table", j.table, "chain", j.from, "to", j.to)
			}
			e.deferred[key] = true
			err = e.insert(j, prev)
		case count == 0:
			err = e.addMissing(j, prev, e.repairing)
		case count > 1 && j.first:
			// iptables -D removes the top copy, which is the one to keep, so
			// remove all and put one back in its place.
			if err = e.delete(j, count, "removing duplicate"); err == nil {
				err = e.addMissing(j, prev, false)
			}
		case count > 1:
			err = e.delete(j, count-1, "removing duplicate") // the last copy stays last
		}
		if err == nil && countRule(e.model[key], line) >= 1 {
			err = e.deleteStrays(j)
		}
		if err == nil && j.first {
			err = e.order(j, prev)
		}
		if err != nil {
			return nil, err
		}
		if j.first {
			prevFirst[key] = line
		}
	}
	return e.lines, nil
}

// jumpEditor applies ensureJumps' edits: through the runner at once, or,
// for a built-in chain marked deferred, as restore lines.
type jumpEditor struct {
	r        *Rules
	model    builtinModel
	lines    map[Table][]string
	deferred map[string]bool // model keys whose edits go to the restore
	// dropLater holds jumps with a -D among the restore lines: the kernel
	// still holds those copies, so iptables -C would find them.
	dropLater map[string]bool
	// repairing: a jump found missing was removed by someone else (Sync's
	// repairing), which is said.
	repairing bool
}

// addMissing adds j unless iptables -C finds it in another spelling;
// removed: another process removed it (Sync's repairing), which is said.
func (e *jumpEditor) addMissing(j jump, prev string, removed bool) error {
	if e.dropLater[joinRule(j.spec())] {
		return e.insert(j, prev) // -C would see the copy the restore deletes
	}
	exists, err := e.r.runner.RuleExists(j.table, j.from, j.spec()...)
	if err != nil {
		return fmt.Errorf("%v: checking jump %s -> %s: %w", e.r.cfg.Family, j.from, j.to, err)
	}
	if exists {
		return nil
	}
	if removed {
		klog.InfoS("Restoring a jump into a chain of ours that another process removed", "family", e.r.cfg.Family, "table", j.table, "chain", j.from, "to", j.to)
	}
	return e.insert(j, prev)
}

// insert puts j at its position: a first jump right below prev (the first
// jump before it in the same chain) or at the top (a refusing one, whose
// prev is not found, at the end), another at the end.
func (e *jumpEditor) insert(j jump, prev string) error {
	key, line := e.model.key(j), joinRule(j.spec())
	pos := 0 // append
	if j.first {
		pos = 1
		if i := slices.Index(e.model[key], prev); prev != "" && i >= 0 {
			pos = i + 2
		} else if prev != "" && j.refuses {
			pos = 0 // below its predecessors, wherever they are
		}
	}
	switch {
	case e.deferred[key] && pos == 0:
		e.lines[j.table] = append(e.lines[j.table], "-A "+j.from+" "+line)
	case e.deferred[key]:
		e.lines[j.table] = append(e.lines[j.table], "-I "+j.from+" "+strconv.Itoa(pos)+" "+line)
	case pos == 0:
		if err := e.r.runner.AppendRule(j.table, j.from, j.spec()...); err != nil {
			return fmt.Errorf("%v: adding jump %s -> %s: %w", e.r.cfg.Family, j.from, j.to, err)
		}
		e.r.wrote.add(j.table, 1)
	default:
		if err := e.r.runner.InsertRule(j.table, j.from, pos, j.spec()...); err != nil {
			return fmt.Errorf("%v: adding jump %s -> %s: %w", e.r.cfg.Family, j.from, j.to, err)
		}
		e.r.wrote.add(j.table, 1)
	}
	if pos == 0 {
		e.model[key] = append(e.model[key], line)
	} else {
		e.model[key] = slices.Insert(e.model[key], pos-1, line)
	}
	return nil
}

// delete removes n copies of j, from the top (iptables -D removes the
// first match).
func (e *jumpEditor) delete(j jump, n int, why string) error {
	key, line := e.model.key(j), joinRule(j.spec())
	for range n {
		if e.deferred[key] {
			e.lines[j.table] = append(e.lines[j.table], "-D "+j.from+" "+line)
			e.dropLater[line] = true
		} else if err := e.r.runner.DeleteRule(j.table, j.from, j.spec()...); err != nil {
			return fmt.Errorf("%v: %s jump %s -> %s: %w", e.r.cfg.Family, why, j.from, j.to, err)
		}
		i := slices.Index(e.model[key], line)
		e.model[key] = slices.Delete(e.model[key], i, i+1)
	}
	return nil
}

// legacyJumpComments are the comments of the jumps the legacy userspace
// kube-proxy put into the built-in chains (pkg/proxy/userspace, before
// v1.26), which deleteStrays removes.
var legacyJumpComments = []string{
	"handle ClusterIPs; NOTE: this must be before the NodePort rules",
	"handle service NodePorts; NOTE: this must be the last rule in the chain",
	"Ensure that non-local NodePort traffic can flow",
}

// deleteStrays removes the legacy kube-proxy's jumps into j's chain of
// ours (recognised by their comments): kept after an in-place migration,
// they sat beside ours, a second way into the same chain. Any other rule
// that jumps to our chain is another tool's (a CNI's "-i cni0 -j
// KUBE-PORTALS-CONTAINER") and stays: every sync removed those too,
// silently, and a tool that put its rule back fought us for ever. Only
// called while our own copy is found by its exact text, so a backend that
// prints ours differently loses nothing.
func (e *jumpEditor) deleteStrays(j jump) error {
	key, line := e.model.key(j), joinRule(j.spec())
	for _, r := range slices.Clone(e.model[key]) {
		if r == line || ruleTarget(r) != j.to {
			continue
		}
		args, err := splitRule(r)
		if err != nil || !isLegacyJump(args) {
			continue
		}
		if e.deferred[key] {
			e.lines[j.table] = append(e.lines[j.table], "-D "+j.from+" "+r)
		} else if err := e.r.runner.DeleteRule(j.table, j.from, args...); err != nil {
			return fmt.Errorf("%v: removing a stray jump %s -> %s (%s): %w", e.r.cfg.Family, j.from, j.to, r, err)
		}
		klog.InfoS("Removed the legacy kube-proxy's jump into a chain of ours", "ipFamily", e.r.cfg.Family, "table", j.table, "chain", j.from, "rule", r)
		i := slices.Index(e.model[key], r)
		e.model[key] = slices.Delete(e.model[key], i, i+1)
	}
	return nil
}

// isLegacyJump reports whether a rule's arguments carry one of
// legacyJumpComments.
func isLegacyJump(args []string) bool {
	return slices.Contains(legacyJumpComments, readRuleArgs(args).comment)
}

// order moves first jump j below prev when it sits above it (only for
// jumps found by their exact text; others cannot be located).
func (e *jumpEditor) order(j jump, prev string) error {
	key, line := e.model.key(j), joinRule(j.spec())
	at, prevAt := slices.Index(e.model[key], line), slices.Index(e.model[key], prev)
	if prev == "" || at < 0 || prevAt < 0 || at > prevAt {
		return nil
	}
	if err := e.delete(j, 1, "moving"); err != nil {
		return err
	}
	return e.addMissing(j, prev, false)
}

func countRule(rules []string, rule string) int {
	n := 0
	for _, r := range rules {
		if r == rule {
			n++
		}
	}
	return n
}

// FirstStartJumps returns, per table, the jump lines a first start (no
// chain of ours in the kernel) writes into that table's restore after our
// chains: the first jumps inserted at the top of their built-in chain in
// order (-I CHAIN N), the NodePort ones appended (-A). A later start adds
// only the jumps it finds missing, with iptables -I/-A, and a sync never
// rewrites the built-in chains. For explain, which shows them.
func (r *Rules) FirstStartJumps() map[Table][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	fresh := map[string]bool{}
	for _, c := range ownedChains {
		fresh[c.name] = true
	}
	// Every jump names a fresh chain, so each becomes a line and none asks
	// the runner: this cannot fail.
	lines, _ := r.ensureJumps(map[Table]savedTable{}, fresh, false)
	return lines
}
