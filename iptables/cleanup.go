package iptables

import (
	"errors"
	"fmt"
	"slices"

	"k8s.io/klog/v2"
)

// Cleanup removes every jump and chain this proxy installs, for the
// runner's family. It is safe when nothing exists, removes duplicate jumps
// and jumps of other shapes (e.g. the legacy proxier's comments), and goes
// on past errors so one failure does not leave the rest behind.
func Cleanup(r Runner) error {
	return cleanupTables(r, TableNAT, TableFilter)
}

// cleanupTables is Cleanup of our chains and jumps in tables only.
func cleanupTables(r Runner, tables ...Table) error {
	c := &cleaner{r: r}
	exists, ok := c.existing(tables)
	if !ok {
		c.done()
		return errors.Join(c.errs...)
	}
	c.deleteOurJumps(exists)
	buckets := c.deleteOtherJumps(tables)
	c.deleteChains(exists, buckets)
	// --cleanup printed nothing at all: a user could not tell a node it
	// cleaned from one that had nothing of ours.
	c.done()
	return errors.Join(c.errs...)
}

// cleaner is one family's cleanup: it goes on past errors, collecting
// them, and counts what it removed.
type cleaner struct {
	r                           Runner
	errs                        []error
	jumpsDeleted, chainsDeleted int
}

func (c *cleaner) fail(err error) { c.errs = append(c.errs, fmt.Errorf("%v: %w", c.r.Family(), err)) }

func (c *cleaner) done() {
	klog.InfoS("Cleaned up", "ipFamily", c.r.Family(), "chainsDeleted", c.chainsDeleted, "jumpsDeleted", c.jumpsDeleted, "errors", len(c.errs))
}

// existing reports which of our chains in tables exist. Not ok: the
// xtables lock stayed held, nothing can be removed.
func (c *cleaner) existing(tables []Table) (exists map[string]bool, ok bool) {
	r := c.r
	exists = map[string]bool{}
	lockTries := cleanupLockTries
	for _, oc := range ownedChains {
		if !slices.Contains(tables, oc.table) {
			continue
		}
		there, err := r.ChainExists(oc.table, oc.name)
		// A chain whose check failed was skipped, left behind for a
		// second run: under a held lock, ask again (each try waits 5 s).
		for ; IsLockHeld(err) && lockTries > 0; lockTries-- {
			klog.InfoS("The xtables lock is held by another process: waiting for it", "ipFamily", r.Family(), "triesLeft", lockTries)
			there, err = r.ChainExists(oc.table, oc.name)
		}
		if IsLockHeld(err) {
			// Nothing removed yet; every later call would wait and fail.
			c.fail(fmt.Errorf("nothing removed, the xtables lock stays held by another process (run --cleanup again): %w", err))
			return nil, false
		}
		if err != nil {
			c.fail(err)
		}
		exists[oc.name] = there
	}
	return exists, true
}

// deleteOurJumps deletes the jumps table's jumps into the chains that
// exist. iptables -C matches semantically, whatever the printing. A
// missing chain cannot have jumps (iptables refuses to delete a
// referenced chain), and -C on it would fail.
func (c *cleaner) deleteOurJumps(exists map[string]bool) {
	r := c.r
	for _, j := range jumps {
		if !exists[j.to] {
			continue
		}
		for range maxDuplicates {
			ok, err := r.RuleExists(j.table, j.from, j.spec()...)
			if err != nil {
				c.fail(err)
			}
			if !ok || err != nil {
				break
			}
			if err := r.DeleteRule(j.table, j.from, j.spec()...); err != nil {
				c.fail(err)
				break
			}
			c.jumpsDeleted++
		}
	}
}

// deleteOtherJumps deletes anything else still jumping to our chains, and
// returns our bucket chains, deleted last.
func (c *cleaner) deleteOtherJumps(tables []Table) (buckets []ownedChain) {
	r := c.r
	data, err := r.Save()
	if err != nil {
		c.fail(err)
		return nil
	}
	for _, table := range tables {
		saved, err := parseSave(data, table)
		if err != nil {
			c.fail(err)
			continue
		}
		for chain := range saved.chains {
			if _, ours := bucketParent(table, chain); ours {
				buckets = append(buckets, ownedChain{table, chain})
			}
		}
		if _, ok := unprintable(data, table); ok {
			// Its dump lists none of our buckets: each is asked for by
			// name (they were all left behind, "errors=0").
			found, err := findBuckets(r, table)
			if err != nil {
				c.fail(err)
			}
			buckets = append(buckets, found...)
		}
		for chain, rules := range saved.rules {
			if isOwned(table, chain) {
				continue
			}
			for _, rule := range rules {
				if !isOwned(table, ruleTarget(rule)) {
					continue
				}
				args, err := splitRule(rule)
				if err == nil {
					err = r.DeleteRule(table, chain, args...)
				}
				if err != nil {
					c.fail(err)
					continue
				}
				c.jumpsDeleted++
				if isOurJump(table, chain, rule) {
					continue // left by the jumps table's pass (its -C failed)
				}
				// Not one of our jumps (those went above): the legacy
				// kube-proxy's, or another tool's. Our chains cannot go
				// while it names them; it went silently.
				klog.InfoS("Removed a rule that jumps to a chain of ours, so the chain can be deleted",
					"ipFamily", r.Family(), "table", table, "chain", chain, "rule", rule,
					"legacyKubeProxy", isLegacyJump(args))
			}
		}
	}
	return buckets
}

// deleteChains deletes our chains that exist, then the buckets: their
// parents are gone, so nothing jumps to them any more.
func (c *cleaner) deleteChains(exists map[string]bool, buckets []ownedChain) {
	for _, oc := range ownedChains {
		if !exists[oc.name] {
			continue
		}
		c.deleteChain(oc)
	}
	for _, oc := range buckets {
		c.deleteChain(oc)
	}
}

func (c *cleaner) deleteChain(oc ownedChain) {
	if err := c.r.DeleteChain(oc.table, oc.name); err != nil {
		c.fail(err)
	} else {
		c.chainsDeleted++
	}
}

// findBuckets asks for the bucket chains of ours in table by name, for a
// table iptables-save cannot print: of each of our chains whose first
// bucket is there (a chain's buckets come and go together), every one.
func findBuckets(r Runner, table Table) ([]ownedChain, error) {
	var out []ownedChain
	for _, c := range ownedChains {
		if c.table != table {
			continue
		}
		for b := range numBuckets {
			name := bucketChain(c.name, b)
			ok, err := r.ChainExists(table, name)
			if err != nil {
				return out, err
			}
			if !ok && b == 0 {
				break
			}
			if ok {
				out = append(out, ownedChain{table, name})
			}
		}
	}
	return out, nil
}

// cleanupLockTries bounds how often Cleanup asks again while the xtables
// lock is held (each try waits 5 s for it: a minute in all).
var cleanupLockTries = 12

// isOurJump reports whether rule, saved in table's chain, is one of the
// jumps table's, printed as we render it.
func isOurJump(table Table, chain, rule string) bool {
	for _, j := range jumps {
		if j.table == table && j.from == chain && joinRule(j.spec()) == rule {
			return true
		}
	}
	return false
}

// maxDuplicates bounds the delete loop per jump, in case a delete reports
// success without removing anything.
const maxDuplicates = 100

func isOwned(table Table, chain string) bool {
	if _, bucket := bucketParent(table, chain); bucket {
		return true
	}
	return slices.Contains(ownedChains, ownedChain{table, chain})
}

// CleanupAll runs Cleanup with the real runners for IPv4 and IPv6, as
// --cleanup does, in the network namespace of the calling thread. Both
// families are attempted whatever happens to the first. A node without
// ip6tables, or whose kernel has no IPv6 nat or filter table (not Present),
// has no IPv6 rules of ours (running serves IPv4 only there), so that is
// not an error; but a filter table without nat (ip6table_nat unloaded
// after a run) can still hold our chains, and is cleaned. An xtables lock
// held by another process says nothing of that, so the IPv6 cleanup is
// tried (and fails) then.
func CleanupAll() error {
	var errs []error
	for _, f := range []Family{IPv4, IPv6} {
		r, err := newRunner(f)
		if err == nil && f == IPv6 {
			err = Present(r)
		}
		if err != nil && f == IPv6 && !IsLockHeld(err) {
			if r == nil || !filterOnly(r) {
				klog.InfoS("No IPv6 rules to clean up: no iptables support for the family", "reason", err)
				continue
			}
			// Its nat table went away after a run (its module
			// unloaded): the filter table's chains of ours are still
			// there, the reject and guard chains among them.
			klog.InfoS("No IPv6 nat table: cleaning up the IPv6 filter table only", "reason", err)
			err = cleanupTables(r, TableFilter)
		} else if err == nil {
			err = errors.Join(Cleanup(r), cleanupOtherBackend(r))
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// filterOnly reports whether r's family has a filter table (and so may
// hold chains of ours) while Present refused it: a nat table missing.
func filterOnly(r Runner) bool {
	ok, err := r.ChainExists(TableFilter, "INPUT")
	return err == nil && ok
}

// newRunner is NewRunner, replaced in tests.
var newRunner = NewRunner
