package iptables

import "strings"

// defaultSplitRestoreAbove is the number of nat rules a Sync rewrite must
// hold before it is written by two restores side by side (runner.go,
// concurrentRestorer): below it one process costs less than two.
const defaultSplitRestoreAbove = 4096

// natSide tells the two independent halves of our nat chains apart: the
// chains PREROUTING reaches (pods and other hosts, 0) and those OUTPUT
// reaches (the node itself, 1). No rule of one half names a chain of the
// other, so each half can be restored on its own.
func natSide(chain string) int {
	name := chain
	if parent, ok := bucketParent(TableNAT, chain); ok {
		name = parent.name
	}
	switch name {
	case "OUTPUT", ChainPortalsHost, ChainNodePortHost:
		return 1
	case "PREROUTING", ChainPortalsContainer, ChainNodePortContainer:
		return 0
	}
	panic("natSide: not a nat chain of ours: " + chain)
}

// writeTable writes one table's chains for Sync: with one restore, or, for
// nat past r.splitRestoreAbove rules and with a runner that can, with one
// restore per half run side by side. Either way the guard is already in
// (the filter table went first). With two, one half may fail while the
// other is written; Sync then reports the error and the next one repairs.
func (r *Rules) writeTable(table Table, want chainRules, chains, gone []ownedChain, jumps []string) error {
	rules := 0
	for _, c := range chains {
		rules += len(want[c.name])
	}
	written := rules
	for _, line := range jumps {
		if strings.HasPrefix(line, "-A ") || strings.HasPrefix(line, "-I ") {
			written++
		}
	}
	cr, ok := r.runner.(concurrentRestorer)
	if table != TableNAT || !ok || rules <= r.splitRestoreAbove || !cr.CanRestoreConcurrently() {
		if err := r.runner.Restore(restoreInput(want, chains, gone, jumps)); err != nil {
			return err
		}
		r.wrote.add(table, written)
		return nil
	}
	var sideChains, sideGone [2][]ownedChain
	var sideJumps [2][]string
	for _, c := range chains {
		sideChains[natSide(c.name)] = append(sideChains[natSide(c.name)], c)
	}
	for _, c := range gone {
		sideGone[natSide(c.name)] = append(sideGone[natSide(c.name)], c)
	}
	for _, line := range jumps { // "-I PREROUTING 1 ...", "-A OUTPUT ...", "-D ..."
		f := strings.Fields(line)
		side := 0
		if len(f) > 1 {
			side = natSide(f[1])
		}
		sideJumps[side] = append(sideJumps[side], line)
	}
	var inputs [][]byte
	for s := range 2 {
		if len(sideChains[s]) > 0 || len(sideGone[s]) > 0 {
			inputs = append(inputs, restoreInput(want, sideChains[s], sideGone[s], sideJumps[s]))
		}
	}
	// A half that went through while the other failed is not counted:
	// the sync failed, and the next one writes it again.
	if err := cr.RestoreConcurrently(inputs); err != nil {
		return err
	}
	r.wrote.add(table, written)
	return nil
}
