package iptables

import (
	"fmt"
	"slices"
	"sync"

	"k8s.io/klog/v2"
)

// Rules keeps one family's portal rules in the kernel. It is safe for
// concurrent use, though the proxier calls Sync from one loop.
type Rules struct {
	runner Runner
	cfg    Config

	mu sync.Mutex
	// printed remembers, per chain, how iptables-save printed the rules we
	// last wrote when that differed from our rendering (another iptables
	// version may order or quote arguments its own way). Such a chain is up
	// to date while we still want what we wrote and the kernel still prints
	// the same; without this it would be rewritten on every sync.
	printed map[string]printedAs
}

type printedAs struct {
	wrote, read []string
}

// New returns the Rules for cfg.Family, programmed through r.
func New(r Runner, cfg Config) *Rules {
	return &Rules{runner: r, cfg: cfg, printed: map[string]printedAs{}}
}

// Sync makes the kernel hold exactly the rules for portals. It creates our
// chains and jump rules when missing (removing duplicate jumps), reads our
// chains back, and only when some differ from the desired rendering
// rewrites those chains with one iptables-restore --noflush. Called on every
// proxier sync, it also repairs rules someone deleted, changed or added.
func (r *Rules) Sync(portals []Portal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.cfg.validate(); err != nil {
		return err
	}
	if f := r.runner.Family(); f != r.cfg.Family {
		return fmt.Errorf("%v rules given a runner for %v", r.cfg.Family, f)
	}
	want := r.desired(portals)
	saved, err := r.readBack()
	if err != nil {
		return err
	}
	if err := r.ensureChains(saved); err != nil {
		return err
	}
	if err := r.ensureJumps(saved); err != nil {
		return err
	}
	stale := r.staleChains(want, saved)
	if len(stale) == 0 {
		return nil
	}
	if err := r.runner.Restore(restoreInput(want, stale)); err != nil {
		return fmt.Errorf("%v: writing chains %v: %w", r.cfg.Family, chainNames(stale), err)
	}
	klog.V(2).InfoS("Rewrote iptables chains", "family", r.cfg.Family, "chains", chainNames(stale))
	return r.learnPrinting(want, stale)
}

// readBack returns the nat and filter tables as the kernel prints them.
func (r *Rules) readBack() (map[Table]savedTable, error) {
	out := map[Table]savedTable{}
	for _, table := range []Table{TableNAT, TableFilter} {
		data, err := r.runner.Save(table)
		if err != nil {
			return nil, fmt.Errorf("%v: reading table %s: %w", r.cfg.Family, table, err)
		}
		if out[table], err = parseSave(data, table); err != nil {
			return nil, fmt.Errorf("%v: %w", r.cfg.Family, err)
		}
	}
	return out, nil
}

// ensureChains creates our chains that are missing, so jumps can point at them.
func (r *Rules) ensureChains(saved map[Table]savedTable) error {
	for _, c := range ownedChains {
		if saved[c.table].chains[c.name] {
			continue
		}
		if err := r.runner.NewChain(c.table, c.name); err != nil {
			return fmt.Errorf("%v: creating chain %s/%s: %w", r.cfg.Family, c.table, c.name, err)
		}
		saved[c.table].chains[c.name] = true
	}
	return nil
}

// ensureJumps installs each jump of the jumps table exactly once. A jump
// printed exactly as we render it is counted from the saved dump (no exec
// in the steady state); otherwise iptables -C decides, so a backend that
// prints differently never gets a second copy.
func (r *Rules) ensureJumps(saved map[Table]savedTable) error {
	firstJumps := map[string]int{} // per table/from: first jumps already placed
	for _, j := range jumps {
		key := string(j.table) + "/" + j.from
		count := countRule(saved[j.table].rules[j.from], joinRule(j.spec()))
		switch {
		case count == 0:
			exists, err := r.runner.RuleExists(j.table, j.from, j.spec()...)
			if err != nil {
				return fmt.Errorf("%v: checking jump %s -> %s: %w", r.cfg.Family, j.from, j.to, err)
			}
			if !exists {
				if err := r.addJump(j, firstJumps[key]+1); err != nil {
					return err
				}
			}
		case count > 1:
			for range count - 1 {
				if err := r.runner.DeleteRule(j.table, j.from, j.spec()...); err != nil {
					return fmt.Errorf("%v: removing duplicate jump %s -> %s: %w", r.cfg.Family, j.from, j.to, err)
				}
			}
		}
		if j.first {
			firstJumps[key]++
		}
	}
	return nil
}

func (r *Rules) addJump(j jump, pos int) error {
	var err error
	if j.first {
		err = r.runner.InsertRule(j.table, j.from, pos, j.spec()...)
	} else {
		err = r.runner.AppendRule(j.table, j.from, j.spec()...)
	}
	if err != nil {
		return fmt.Errorf("%v: adding jump %s -> %s: %w", r.cfg.Family, j.from, j.to, err)
	}
	return nil
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

// staleChains returns our chains whose saved contents are not what we want.
func (r *Rules) staleChains(want chainRules, saved map[Table]savedTable) []ownedChain {
	var stale []ownedChain
	for _, c := range ownedChains {
		got := saved[c.table].rules[c.name]
		if slices.Equal(got, want[c.name]) {
			continue
		}
		if p, ok := r.printed[c.name]; ok && slices.Equal(p.wrote, want[c.name]) && slices.Equal(p.read, got) {
			continue
		}
		stale = append(stale, c)
	}
	return stale
}

// learnPrinting reads back the chains just written, checks that the write
// took effect, and remembers how the kernel prints them (see Rules.printed).
func (r *Rules) learnPrinting(want chainRules, written []ownedChain) error {
	saved, err := r.readBack()
	if err != nil {
		return err
	}
	for _, c := range written {
		got := saved[c.table].rules[c.name]
		switch {
		case slices.Equal(got, want[c.name]):
			delete(r.printed, c.name)
		case len(got) == len(want[c.name]):
			r.printed[c.name] = printedAs{wrote: want[c.name], read: got}
		default:
			return fmt.Errorf("%v: after restore chain %s/%s holds %d rules, want %d",
				r.cfg.Family, c.table, c.name, len(got), len(want[c.name]))
		}
	}
	return nil
}

func chainNames(chains []ownedChain) []string {
	names := make([]string, len(chains))
	for i, c := range chains {
		names[i] = c.name
	}
	return names
}
