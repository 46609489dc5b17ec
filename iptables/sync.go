package iptables

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

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
	// bucketAbove: a chain with more rules is split into buckets (chains.go).
	bucketAbove int
	// splitRestoreAbove: a nat rewrite of more rules is written by two
	// restores side by side when the runner can (split.go).
	splitRestoreAbove int
	// cache is the rendering of the last portal set (renderAll).
	cache renderCache
	// lastRead is the dump ProxyPortsInKernel read at lastReadAt, for the
	// Sync right after it (takeLastRead); Update drops it.
	lastRead   map[Table]savedTable
	lastReadAt time.Time
	// have is what our chains hold, in our spelling, after the last
	// successful write or verified read-back; nil when unknown (before the
	// first full Sync and after any failure). Update works from it.
	have chainRules
	// written holds the chains this process has written. A write is
	// trusted on iptables-restore's exit status, as kube-proxy trusts it;
	// the next Sync's read-back checks it. Only a chain written before that
	// reads back differently is read again right after its rewrite, to tell
	// the kernel's printing (learned) from a write without effect (an
	// error). Reading every write back cost the first sync at 10,000
	// Services 0.58 s of its 1.9 s.
	written map[string]bool
	// unprintableSaid holds the tables sayUnprintables has said
	// iptables-save cannot print, until it prints them again.
	unprintableSaid map[Table]bool
	// kubeProxyJumps are kube-proxy's jumps the last read-back found
	// (noteKubeProxy), said once per change.
	kubeProxyJumps []string
	// kubeProxyNftTable: the last read-back found kube-proxy's nftables
	// table of this family (noteKubeProxyNft), said once per change.
	kubeProxyNftTable bool
	// drifted: a Sync found our chains changed by someone else and has
	// not rewritten them yet (its write failed): the next one that does
	// counts the repair, though its own read-back no longer shows it.
	drifted bool
	// wrote counts the rules the current Sync or Update writes.
	wrote writeCount
	stats ruleStats
}

type printedAs struct {
	wrote, read []string
}

// New returns the Rules for cfg.Family, programmed through r.
func New(r Runner, cfg Config) *Rules {
	return &Rules{runner: r, cfg: cfg, printed: map[string]printedAs{}, written: map[string]bool{}, unprintableSaid: map[Table]bool{}, bucketAbove: defaultBucketAbove, splitRestoreAbove: defaultSplitRestoreAbove}
}

// Sync makes the kernel hold exactly the rules for portals. It reads our
// chains back, fixes the jump rules (removing duplicates), and only when
// some chains differ from the desired rendering rewrites those chains with
// iptables-restore --noflush, one per table, filter first (a large nat
// rewrite as two side by side: split.go), which also creates missing
// chains and adds the jumps to them. Called
// periodically, it also repairs rules someone deleted, changed or added;
// Update is the cheap path for changes in between.
func (r *Rules) Sync(portals []Portal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.startCount()()
	return r.syncLocked(portals)
}

// syncLocked is Sync with r.mu held. On success it records what the chains
// hold for Update; on failure it forgets it, so the next Update is a full
// Sync again.
func (r *Rules) syncLocked(portals []Portal) error {
	prev := r.have
	r.have = nil
	if err := r.cfg.validate(); err != nil {
		return err
	}
	if f := r.runner.Family(); f != r.cfg.Family {
		return fmt.Errorf("%v rules given a runner for %v", r.cfg.Family, f)
	}
	want := r.desired(portals)
	saved := r.takeLastRead()
	if saved == nil {
		var err error
		if saved, err = r.readBack(); err != nil {
			return err
		}
	}
	// Nothing of ours changed since the last sync that went through: what
	// differs now, someone else changed (a flush, a deleted rule), and a
	// repair is said at the default level; it was only V(2) "Rewrote".
	repairing := prev != nil && maps.EqualFunc(prev, want, slices.Equal)
	fresh := missingChains(saved)
	// An unprintable table reads as empty, but our chains may be in it
	// all the same: each is asked for, so that the jump to one that exists
	// is checked with iptables -C (which works there) and not inserted
	// blind once more at every sync.
	for _, c := range ownedChains {
		if !fresh[c.name] {
			continue
		}
		exists, err := r.chainIn(saved, c.table, c.name)
		if err != nil {
			return err
		}
		if exists {
			delete(fresh, c.name)
		}
	}
	r.sayUnprintables(saved)
	jumpLines, err := r.ensureJumps(saved, fresh, repairing)
	if err != nil {
		return err
	}
	stale, drop := r.staleChains(want, saved), unwantedBuckets(want, saved)
	// The dump of an unprintable table lists none of our buckets.
	unseen, err := r.unseenBuckets(prev, saved)
	if err != nil {
		return err
	}
	for _, c := range unseen {
		if !hasChain(want, c.name) {
			drop = append(drop, c)
		}
	}
	// An unprintable table's chains read as missing at every sync and are
	// rewritten: that is no repair of someone else's change.
	seen := func(cs []ownedChain) []ownedChain {
		return slices.DeleteFunc(slices.Clone(cs), func(c ownedChain) bool { return saved[c.table].unprintable != "" })
	}
	if visible := seen(stale); repairing && len(visible) > 0 {
		klog.InfoS("Repairing iptables chains another process changed", "family", r.cfg.Family, "chains", chainNames(visible))
	}
	switch {
	case repairing:
		r.drifted = r.drifted || len(seen(stale)) > 0
	case prev != nil:
		// Our own changes are rewritten too: compare with what we had.
		r.drifted = r.drifted || len(seen(r.staleChains(prev, saved))) > 0
	}
	if len(stale) == 0 && len(drop) == 0 {
		r.have = want
		r.countHave()
		return nil
	}
	check, err := r.writeStale(want, stale, drop, jumpLines, saved)
	if err != nil {
		return err
	}
	klog.V(2).InfoS("Rewrote iptables chains", "family", r.cfg.Family, "chains", chainNames(stale))
	if r.drifted {
		r.drifted = false
		r.stats.repairs.Add(1)
	}
	if len(check) > 0 {
		if err := r.learnPrinting(want, check); err != nil {
			return err
		}
	}
	r.have = want
	r.countHave()
	return nil
}

// writeStale rewrites the stale chains and deletes the dropped ones, a
// restore per table, filter first: iptables-restore commits each table on
// its own, so with both in one input a failed filter part left the nat
// part applied, and new portals sent traffic to proxy ports that had no
// guard yet. Now a portal is written only once its guard is in. check:
// the chains of printable tables written again, which learnPrinting
// reads back.
func (r *Rules) writeStale(want chainRules, stale, drop []ownedChain, jumpLines map[Table][]string, saved map[Table]savedTable) (check []ownedChain, err error) {
	for _, table := range []Table{TableFilter, TableNAT} {
		these, gone := chainsOf(stale, table), chainsOf(drop, table)
		if len(these) == 0 && len(gone) == 0 {
			// Jump lines come only with a fresh chain of their table,
			// which is stale, so none are left behind here.
			continue
		}
		if err := r.writeTable(table, want, these, gone, jumpLines[table]); err != nil {
			return nil, fmt.Errorf("%v: writing chains %v: %w", r.cfg.Family, chainNames(these), err)
		}
		// Recorded per table: a later table's failure leaves this one's
		// write in force, and known.
		for _, c := range these {
			if r.written[c.name] && saved[table].unprintable == "" {
				check = append(check, c)
			}
			r.written[c.name] = true
		}
	}
	return check, nil
}

// sayUnprintables logs, once each time it starts and ends, that
// iptables-save cannot print a table. Our chains in it are written all the
// same (iptables-restore and iptables -C work there) and the sync succeeds:
// failed, it was retried without end and /healthz answered 503 on a node
// whose Services were served, so load balancers took it out. What such a
// table costs is that every full sync rewrites our chains in it, unchecked.
func (r *Rules) sayUnprintables(saved map[Table]savedTable) {
	for _, table := range []Table{TableFilter, TableNAT} {
		line := saved[table].unprintable
		switch {
		case line != "" && !r.unprintableSaid[table]:
			r.unprintableSaid[table] = true
			klog.InfoS("Warning: iptables-save cannot print a table: it holds rules this iptables cannot decode, written by a newer iptables or by nft; "+
				"our chains in it are rewritten at every full sync and cannot be checked", "family", r.cfg.Family, "table", table, "printed", line)
		case line == "" && r.unprintableSaid[table]:
			delete(r.unprintableSaid, table)
			klog.InfoS("iptables-save prints the table again", "family", r.cfg.Family, "table", table)
		}
	}
}

// chainIn reports whether table holds chain: as the dump says, or, for a
// table iptables-save cannot print (which reads as empty), as iptables
// answers when asked for the chain by name.
func (r *Rules) chainIn(saved map[Table]savedTable, table Table, chain string) (bool, error) {
	t := saved[table]
	if t.chains[chain] || t.unprintable == "" {
		return t.chains[chain], nil
	}
	ok, err := r.runner.ChainExists(table, chain)
	if err != nil {
		return false, fmt.Errorf("%v: looking for chain %s/%s, as iptables-save cannot print its table (%q): %w", r.cfg.Family, table, chain, t.unprintable, err)
	}
	return ok, nil
}

// readBack returns the nat and filter tables as the kernel prints them,
// from one dump of every table: iptables-nft fetches the whole ruleset for
// any table it prints, so a dump per table cost twice as much (10,000
// Services: 0.45 s against 0.27 s).
func (r *Rules) readBack() (map[Table]savedTable, error) {
	data, err := r.runner.Save()
	if err != nil {
		return nil, fmt.Errorf("%v: reading the tables: %w", r.cfg.Family, err)
	}
	out := map[Table]savedTable{}
	for _, table := range []Table{TableNAT, TableFilter} {
		t, err := parseSave(data, table)
		if err != nil {
			return nil, fmt.Errorf("%v: %w", r.cfg.Family, err)
		}
		t.unprintable, _ = unprintable(data, table)
		out[table] = t
		if n := out[table].skipped; n > 0 {
			klog.V(2).InfoS("Skipped lines of iptables-save output not understood (another tool's)", "family", r.cfg.Family, "table", table, "lines", n)
		}
	}
	if out[TableNAT].unprintable == "" {
		// Unprintable, nat reads as empty: kube-proxy's jumps were said
		// gone, and found again at the next dump that printed it.
		r.noteKubeProxy(out[TableNAT])
	}
	r.noteKubeProxyNft()
	return out, nil
}

// missingChains returns the names of our chains the kernel does not hold.
// Each is stale (staleChains), so its table's restore declares it.
func missingChains(saved map[Table]savedTable) map[string]bool {
	out := map[string]bool{}
	for _, c := range ownedChains {
		if !saved[c.table].chains[c.name] {
			out[c.name] = true
		}
	}
	return out
}

// staleChains returns our chains (buckets included) whose saved contents
// are not what we want, or that are missing.
func (r *Rules) staleChains(want chainRules, saved map[Table]savedTable) []ownedChain {
	var stale []ownedChain
	for _, c := range renderedChains(want) {
		got := saved[c.table].rules[c.name]
		if !saved[c.table].chains[c.name] {
			stale = append(stale, c)
			continue
		}
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

// unwantedBuckets returns the bucket chains of ours the kernel holds that
// want has no place for (a chain went back below bucketAbove).
func unwantedBuckets(want chainRules, saved map[Table]savedTable) []ownedChain {
	var out []ownedChain
	for _, table := range []Table{TableNAT, TableFilter} {
		for name := range saved[table].chains {
			if _, ours := bucketParent(table, name); ours && !hasChain(want, name) {
				out = append(out, ownedChain{table, name})
			}
		}
	}
	slices.SortFunc(out, func(a, b ownedChain) int { return strings.Compare(a.name, b.name) })
	return out
}

// unseenBuckets returns the bucket chains of ours that may be in the
// tables iptables-save cannot print, whose dump lists none of them: those
// prev (what the last sync wrote) holds, or without it (a start, a sync
// after a failure) every bucket of each of our chains whose first bucket
// is there, asked for by name (a chain's buckets come and go together; a
// bucket declared and deleted that was not there costs nothing). Taken
// from the dump alone, the buckets of a layout no longer wanted (a chain
// back below bucketAbove) stayed for good, and a restart left them too.
func (r *Rules) unseenBuckets(prev chainRules, saved map[Table]savedTable) ([]ownedChain, error) {
	var out []ownedChain
	for _, c := range ownedChains {
		if saved[c.table].unprintable == "" {
			continue
		}
		if prev == nil {
			exists, err := r.chainIn(saved, c.table, bucketChain(c.name, 0))
			if err != nil {
				return nil, err
			}
			if !exists {
				continue
			}
		}
		for b := range numBuckets {
			if name := bucketChain(c.name, b); prev == nil || hasChain(prev, name) {
				out = append(out, ownedChain{c.table, name})
			}
		}
	}
	return out, nil
}

// learnPrinting reads back chains just written, checks that the write took
// effect, and remembers how the kernel prints them (see Rules.printed).
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

func chainsOf(chains []ownedChain, table Table) []ownedChain {
	var out []ownedChain
	for _, c := range chains {
		if c.table == table {
			out = append(out, c)
		}
	}
	return out
}

func chainNames(chains []ownedChain) []string {
	names := make([]string, len(chains))
	for i, c := range chains {
		names[i] = c.name
	}
	return names
}
