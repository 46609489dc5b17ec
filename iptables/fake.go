package iptables

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// FakeRunner is an in-memory Runner for tests (ours and the proxier's). It
// keeps the nat and filter tables with their built-in chains, records every
// call, and prints Save output in iptables-save format, so tests can assert
// the exact state the kernel would hold.
type FakeRunner struct {
	mu     sync.Mutex
	family Family
	tables map[Table]*fakeTable
	calls  []string
	writes [][]byte
	// Errors makes the named method ("Save", "Restore", "InsertRule", ...)
	// fail with the given error, without changing state.
	Errors map[string]error
	// Normalize, when set, rewrites every stored rule, to mimic a backend
	// whose iptables-save prints rules differently from how we render them.
	Normalize func(rule string) string
	// Unprintable names tables whose dump is only iptables-save's
	// "# Table `nat' is incompatible, use 'nft' tool." (rules it cannot
	// decode: written by a newer iptables or by nft); every other call
	// works on them as on any table, as iptables does.
	Unprintable map[Table]bool
	// Tainted names tables whose dump iptables-nft (1.8.8 on) begins with
	// "# Table `nat' contains incompatible base-chains, use 'nft' tool to
	// list them." (a base chain of another tool's in the table) and then
	// prints in full.
	Tainted map[Table]bool
	// Incompatible names chains ("nat/POSTROUTING") holding a rule this
	// iptables cannot decode: `iptables -S CHAIN 1` exits 1 ("chain
	// `POSTROUTING' in table `nat' is incompatible, use 'nft' tool."),
	// which ChainExists reads as no such chain.
	Incompatible map[string]bool
	// NftTables are the names of the nftables tables of the runner's
	// family (ip, ip6) that ListNftTables lists: kube-proxy's nftables
	// mode leaves "kube-proxy".
	NftTables []string
}

type fakeTable struct {
	chains []string // built-in chains first, then user chains in creation order
	rules  map[string][]string
}

var builtinChains = map[Table][]string{
	TableNAT:    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	TableFilter: {"INPUT", "FORWARD", "OUTPUT"},
}

func isBuiltin(table Table, chain string) bool {
	return slices.Contains(builtinChains[table], chain)
}

// checkJumpTarget refuses a rule that jumps to a chain of ours (KUBE-*)
// that t does not hold, as iptables does: a jump can only name a chain
// that exists, which Sync relies on.
func checkJumpTarget(t *fakeTable, rule string) error {
	if to := ruleTarget(rule); strings.HasPrefix(to, "KUBE-") && !slices.Contains(t.chains, to) {
		return fmt.Errorf("fake: jump to missing chain %s", to)
	}
	return nil
}

// NewFakeRunner returns a FakeRunner holding empty nat and filter tables.
func NewFakeRunner(f Family) *FakeRunner {
	fr := &FakeRunner{family: f, tables: map[Table]*fakeTable{}}
	for table, chains := range builtinChains {
		fr.tables[table] = &fakeTable{chains: slices.Clone(chains), rules: map[string][]string{}}
	}
	return fr
}

// RemoveTable takes a table away, as on a node whose kernel has no module
// for it (ip6table_nat) or has IPv6 disabled at boot: every call naming it
// fails, as iptables does ("table does not exist"), and a dump of every
// table leaves it out, as iptables-save prints only the tables the kernel
// has.
func (f *FakeRunner) RemoveTable(table Table) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.tables, table)
}

// Calls returns the calls made so far, one line each, e.g. "Save nat" or
// "InsertRule filter INPUT 1 -m comment ...".
func (f *FakeRunner) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// CallsOf counts the recorded calls of method ("Save", "Restore", ...).
func (f *FakeRunner) CallsOf(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if name, _, _ := strings.Cut(c, " "); name == method {
			n++
		}
	}
	return n
}

// Writes returns the input of every successful Restore, in order.
func (f *FakeRunner) Writes() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.writes)
}

// ResetCalls forgets recorded calls and writes (state is kept).
func (f *FakeRunner) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls, f.writes = nil, nil
}

// Rules returns a chain's rules as iptables-save prints them after
// "-A CHAIN ", or nil when the chain is empty or missing.
func (f *FakeRunner) Rules(table Table, chain string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tables[table].rules[chain])
}

// Chains returns the chains of a table, built-in ones first.
func (f *FakeRunner) Chains(table Table) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tables[table].chains)
}

func (f *FakeRunner) Family() Family { return f.family }

// SetError makes method fail with err from now on (nil: succeed again);
// safe while another goroutine uses the runner, unlike writing Errors.
func (f *FakeRunner) SetError(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Errors == nil {
		f.Errors = map[string]error{}
	}
	if err == nil {
		delete(f.Errors, method)
		return
	}
	f.Errors[method] = err
}

// begin records a call and returns the injected error for it, if any.
func (f *FakeRunner) begin(method string, args ...string) error {
	f.calls = append(f.calls, strings.TrimSpace(method+" "+strings.Join(args, " ")))
	return f.Errors[method]
}

func (f *FakeRunner) table(table Table) (*fakeTable, error) {
	t, ok := f.tables[table]
	if !ok {
		return nil, fmt.Errorf("fake: table %q does not exist", table)
	}
	return t, nil
}

func (f *FakeRunner) normalize(rule string) string {
	if f.Normalize != nil {
		return f.Normalize(rule)
	}
	return rule
}

func (f *FakeRunner) ChainExists(table Table, chain string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("ChainExists", string(table), chain); err != nil {
		return false, err
	}
	t, err := f.table(table)
	if err != nil {
		return false, err
	}
	if f.Incompatible[string(table)+"/"+chain] {
		return false, nil
	}
	return slices.Contains(t.chains, chain), nil
}

func (f *FakeRunner) NewChain(table Table, chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("NewChain", string(table), chain); err != nil {
		return err
	}
	t, err := f.table(table)
	if err != nil {
		return err
	}
	if slices.Contains(t.chains, chain) {
		return fmt.Errorf("fake: chain %s/%s already exists", table, chain)
	}
	t.chains = append(t.chains, chain)
	return nil
}

func (f *FakeRunner) DeleteChain(table Table, chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("DeleteChain", string(table), chain); err != nil {
		return err
	}
	t, err := f.table(table)
	if err != nil {
		return err
	}
	if !slices.Contains(t.chains, chain) || isBuiltin(table, chain) {
		return fmt.Errorf("fake: no user chain %s/%s", table, chain)
	}
	for from, rules := range t.rules {
		for _, rule := range rules {
			if from != chain && ruleTarget(rule) == chain {
				return fmt.Errorf("fake: chain %s/%s is referenced by %s", table, chain, from)
			}
		}
	}
	t.chains = slices.DeleteFunc(t.chains, func(c string) bool { return c == chain })
	delete(t.rules, chain)
	return nil
}

// existingChain returns a chain's table, or an error if the chain is missing.
func (f *FakeRunner) existingChain(table Table, chain string) (*fakeTable, error) {
	t, err := f.table(table)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(t.chains, chain) {
		return nil, fmt.Errorf("fake: no chain %s/%s", table, chain)
	}
	return t, nil
}

func (f *FakeRunner) RuleExists(table Table, chain string, args ...string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rule := f.normalize(joinRule(args))
	if err := f.begin("RuleExists", string(table), chain, rule); err != nil {
		return false, err
	}
	t, err := f.existingChain(table, chain)
	if err != nil {
		return false, err
	}
	return slices.Contains(t.rules[chain], rule), nil
}

func (f *FakeRunner) InsertRule(table Table, chain string, pos int, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rule := f.normalize(joinRule(args))
	if err := f.begin("InsertRule", string(table), chain, strconv.Itoa(pos), rule); err != nil {
		return err
	}
	t, err := f.existingChain(table, chain)
	if err != nil {
		return err
	}
	if err := checkJumpTarget(t, rule); err != nil {
		return err
	}
	if pos < 1 || pos > len(t.rules[chain])+1 {
		return fmt.Errorf("fake: index %d out of range in %s/%s", pos, table, chain)
	}
	t.rules[chain] = slices.Insert(t.rules[chain], pos-1, rule)
	return nil
}

func (f *FakeRunner) AppendRule(table Table, chain string, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rule := f.normalize(joinRule(args))
	if err := f.begin("AppendRule", string(table), chain, rule); err != nil {
		return err
	}
	t, err := f.existingChain(table, chain)
	if err != nil {
		return err
	}
	if err := checkJumpTarget(t, rule); err != nil {
		return err
	}
	t.rules[chain] = append(t.rules[chain], rule)
	return nil
}

func (f *FakeRunner) DeleteRule(table Table, chain string, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rule := f.normalize(joinRule(args))
	if err := f.begin("DeleteRule", string(table), chain, rule); err != nil {
		return err
	}
	t, err := f.existingChain(table, chain)
	if err != nil {
		return err
	}
	i := slices.Index(t.rules[chain], rule)
	if i < 0 {
		return fmt.Errorf("fake: no rule %q in %s/%s", rule, table, chain)
	}
	t.rules[chain] = slices.Delete(t.rules[chain], i, i+1)
	return nil
}

// ListNftTables returns NftTables, or Errors["ListNftTables"]. It is not
// recorded as a call: it reads no iptables table.
func (f *FakeRunner) ListNftTables() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.Errors["ListNftTables"]; err != nil {
		return nil, err
	}
	return slices.Clone(f.NftTables), nil
}
