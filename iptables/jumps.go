package iptables

import (
	"fmt"
	"slices"
	"strconv"
)

// builtinModel mirrors the rules of the built-in chains as saved, updated
// with every change ensureJumps makes, so insert positions are computed
// against what the kernel holds now and not against a stale read.
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
// yet, as no rule can name a missing chain: it is not checked nor added
// here but returned as a line of its table's restore, which declares the
// chain first. A first start thus writes chains, contents and jumps in one
// iptables-restore per table; an exec per chain and two per jump cost the
// first sync at 10,000 Services 0.2 s.
func (r *Rules) ensureJumps(saved map[Table]savedTable, fresh map[string]bool) (map[Table][]string, error) {
	lines := map[Table][]string{}
	model := builtinModel{}
	for _, j := range jumps {
		if _, ok := model[model.key(j)]; !ok {
			model[model.key(j)] = slices.Clone(saved[j.table].rules[j.from])
		}
	}
	prevFirst := map[string]string{} // per built-in chain: the last first jump placed
	for _, j := range jumps {
		key, line := model.key(j), joinRule(j.spec())
		var err error
		switch count := countRule(model[key], line); {
		case fresh[j.to]:
			lines[j.table] = append(lines[j.table], model.add(j, prevFirst[key]))
		case count == 0:
			err = r.addMissingJump(model, j, prevFirst[key])
		case count > 1 && j.first:
			// iptables -D removes the top copy, which is the one to keep, so
			// remove all and put one back in its place.
			if err = r.dropDuplicateJumps(model, j, count); err == nil {
				err = r.addMissingJump(model, j, prevFirst[key])
			}
		case count > 1:
			err = r.dropDuplicateJumps(model, j, count-1) // the last copy stays last
		}
		if err == nil && j.first {
			err = r.orderJump(model, j, prevFirst[key])
		}
		if err != nil {
			return nil, err
		}
		if j.first {
			prevFirst[key] = line
		}
	}
	return lines, nil
}

// addMissingJump adds j unless iptables -C finds it in another spelling.
// A first jump goes right below prev (the first jump before it in the same
// chain), or to the top.
func (r *Rules) addMissingJump(model builtinModel, j jump, prev string) error {
	exists, err := r.runner.RuleExists(j.table, j.from, j.spec()...)
	if err != nil {
		return fmt.Errorf("%v: checking jump %s -> %s: %w", r.cfg.Family, j.from, j.to, err)
	}
	if exists {
		return nil
	}
	if pos := model.position(j, prev); pos == 0 {
		err = r.runner.AppendRule(j.table, j.from, j.spec()...)
	} else {
		err = r.runner.InsertRule(j.table, j.from, pos, j.spec()...)
	}
	if err != nil {
		return fmt.Errorf("%v: adding jump %s -> %s: %w", r.cfg.Family, j.from, j.to, err)
	}
	model.add(j, prev)
	return nil
}

// position is where j goes in its built-in chain: 0 to append (not a first
// jump), else the 1-based insert position right below prev (the first jump
// before it in the same chain), or the top.
func (m builtinModel) position(j jump, prev string) int {
	if !j.first {
		return 0
	}
	if i := slices.Index(m[m.key(j)], prev); prev != "" && i >= 0 {
		return i + 2
	}
	return 1
}

// add records j at its position and returns it as an iptables-restore line.
func (m builtinModel) add(j jump, prev string) string {
	key, line := m.key(j), joinRule(j.spec())
	pos := m.position(j, prev)
	if pos == 0 {
		m[key] = append(m[key], line)
		return "-A " + j.from + " " + line
	}
	m[key] = slices.Insert(m[key], pos-1, line)
	return "-I " + j.from + " " + strconv.Itoa(pos) + " " + line
}

// dropDuplicateJumps deletes n copies of j, from the top (iptables -D
// removes the first match).
func (r *Rules) dropDuplicateJumps(model builtinModel, j jump, n int) error {
	key, line := model.key(j), joinRule(j.spec())
	for range n {
		if err := r.runner.DeleteRule(j.table, j.from, j.spec()...); err != nil {
			return fmt.Errorf("%v: removing duplicate jump %s -> %s: %w", r.cfg.Family, j.from, j.to, err)
		}
		i := slices.Index(model[key], line)
		model[key] = slices.Delete(model[key], i, i+1)
	}
	return nil
}

// orderJump moves first jump j below prev when it sits above it (only for
// jumps found by their exact text; others cannot be located).
func (r *Rules) orderJump(model builtinModel, j jump, prev string) error {
	key, line := model.key(j), joinRule(j.spec())
	at, prevAt := slices.Index(model[key], line), slices.Index(model[key], prev)
	if prev == "" || at < 0 || prevAt < 0 || at > prevAt {
		return nil
	}
	if err := r.runner.DeleteRule(j.table, j.from, j.spec()...); err != nil {
		return fmt.Errorf("%v: moving jump %s -> %s: %w", r.cfg.Family, j.from, j.to, err)
	}
	model[key] = slices.Delete(model[key], at, at+1)
	return r.addMissingJump(model, j, prev)
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
