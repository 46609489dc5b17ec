package iptables

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"

	goipt "github.com/coreos/go-iptables/iptables"
	"k8s.io/klog/v2"
)

// Runner is the edge between the rules and the kernel, for one IP family.
// The real one (NewRunner) shells out to iptables; FakeRunner keeps tables
// in memory for tests.
type Runner interface {
	Family() Family
	// ChainExists reports whether a chain exists in table.
	ChainExists(table Table, chain string) (bool, error)
	// DeleteChain flushes and deletes a chain; it is an error if it does not
	// exist or a rule still jumps to it.
	DeleteChain(table Table, chain string) error
	// RuleExists reports whether chain holds a rule matching args (iptables -C).
	RuleExists(table Table, chain string, args ...string) (bool, error)
	// InsertRule inserts a rule at position pos (1 = first).
	InsertRule(table Table, chain string, pos int, args ...string) error
	// AppendRule appends a rule.
	AppendRule(table Table, chain string, args ...string) error
	// DeleteRule deletes the first rule matching args.
	DeleteRule(table Table, chain string, args ...string) error
	// Save returns iptables-save output holding the given tables: one
	// table when one is named, else every table (one dump, where the nft
	// backend fetches the whole ruleset for any one table anyway).
	Save(tables ...Table) ([]byte, error)
	// Restore feeds data to iptables-restore --noflush: chains declared in
	// data are flushed and refilled, everything else is left alone.
	Restore(data []byte) error
}

// execRunner is the real Runner: go-iptables for single rules and chains,
// iptables-save / iptables-restore for whole chains.
type execRunner struct {
	family  Family
	ipt     *goipt.IPTables
	save    string // path of iptables-save or ip6tables-save
	restore string // path of iptables-restore or ip6tables-restore
	// nftables: the binaries are iptables-nft ("(nf_tables)" in --version).
	nftables bool
	// restoreWait is the wait flag iptables-restore is given, none where
	// it does not know one (restoreWaitArgs).
	restoreWait []string
}

// iptablesVersion is what restoreWaitArgs reads of go-iptables.
type iptablesVersion interface {
	GetIptablesVersion() (int, int, int)
}

// restoreWaitMinVersion is the first iptables whose iptables-restore takes
// -w (kube-proxy's WaitRestoreMinVersion).
var restoreWaitMinVersion = [3]int{1, 6, 2}

// restoreWaitArgs is the wait flag for iptables-restore of the iptables
// version go-iptables found (that of the iptables binary, which ships with
// its iptables-restore): -w 5 from 1.6.2, as kube-proxy, and none before,
// where iptables-restore refuses the flag and so every restore would fail.
func restoreWaitArgs(v iptablesVersion) []string {
	v1, v2, v3 := v.GetIptablesVersion()
	if slices.Compare([]int{v1, v2, v3}, restoreWaitMinVersion[:]) < 0 {
		return nil
	}
	return []string{"-w", "5"}
}

// NewRunner returns the real Runner for a family. It fails when the
// iptables binaries are missing. Commands run in the network namespace of
// the calling OS thread (tests lock a thread into their own namespace).
func NewRunner(f Family) (Runner, error) {
	r, err := newExecRunner(f, "")
	if err != nil {
		return nil, err
	}
	return r, nil
}

// newExecRunner is NewRunner for one backend: backend "" runs iptables
// (whichever the node's alternatives name), "legacy" or "nft" the
// iptables-legacy or iptables-nft commands.
func newExecRunner(f Family, backend string) (*execRunner, error) {
	proto, prefix := goipt.ProtocolIPv4, "iptables"
	if f == IPv6 {
		proto, prefix = goipt.ProtocolIPv6, "ip6tables"
	}
	command := "" // go-iptables finds iptables or ip6tables
	if backend != "" {
		prefix += "-" + backend
		command = prefix
	}
	ipt, err := goipt.New(goipt.IPFamily(proto), goipt.Timeout(5), goipt.Path(command))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", prefix, err)
	}
	r := &execRunner{family: f, ipt: ipt, restoreWait: restoreWaitArgs(ipt)}
	if r.restoreWait == nil {
		v1, v2, v3 := ipt.GetIptablesVersion()
		klog.InfoS("iptables-restore is run without a wait flag: this iptables is older than 1.6.2", "family", f, "version", fmt.Sprintf("%d.%d.%d", v1, v2, v3))
	}
	if r.save, err = exec.LookPath(prefix + "-save"); err != nil {
		return nil, err
	}
	if r.restore, err = exec.LookPath(prefix + "-restore"); err != nil {
		return nil, err
	}
	if out, err := exec.Command(r.save, "--version").Output(); err == nil {
		r.nftables = bytes.Contains(out, []byte("nf_tables"))
	}
	return r, nil
}

func (r *execRunner) Family() Family { return r.family }

// The single commands go through go-iptables, which starts them in the
// proxy's process group (it sets no SysProcAttr, and has no hook for one),
// so a signal sent to the group (a Ctrl-C at the terminal, timeout(1))
// kills one running then, and the sync it belonged to failed, logged. The
// reads (ChainExists, RuleExists: -S, -C) are run again when a signal
// killed them, as Save and Restore are (runAgainIfSignalled); the writes
// are not: one killed after its commit would be doubled (-I, -A) or fail
// (-D) when run again, and the next sync repairs what it did not do.

func (r *execRunner) ChainExists(table Table, chain string) (bool, error) {
	var exists bool
	err := runAgainIfSignalled(func() (err error) {
		exists, err = r.ipt.ChainExists(string(table), chain)
		return err
	})
	return exists, err
}

func (r *execRunner) DeleteChain(table Table, chain string) error {
	if err := r.ipt.ClearChain(string(table), chain); err != nil {
		return err
	}
	return r.ipt.DeleteChain(string(table), chain)
}

func (r *execRunner) RuleExists(table Table, chain string, args ...string) (bool, error) {
	var exists bool
	err := runAgainIfSignalled(func() (err error) {
		exists, err = r.ipt.Exists(string(table), chain, args...)
		return err
	})
	return exists, err
}

func (r *execRunner) InsertRule(table Table, chain string, pos int, args ...string) error {
	return r.ipt.Insert(string(table), chain, pos, args...)
}

func (r *execRunner) AppendRule(table Table, chain string, args ...string) error {
	return r.ipt.Append(string(table), chain, args...)
}

func (r *execRunner) DeleteRule(table Table, chain string, args ...string) error {
	return r.ipt.Delete(string(table), chain, args...)
}

func (r *execRunner) Save(tables ...Table) ([]byte, error) {
	var out, stderr bytes.Buffer
	err := runAgainIfSignalled(func() error {
		out.Reset()
		stderr.Reset()
		cmd := ownGroup(exec.Command(r.save))
		if len(tables) == 1 {
			cmd.Args = append(cmd.Args, "-t", string(tables[0]))
		}
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			return commandError(cmd, err, &stderr)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func (r *execRunner) Restore(data []byte) error {
	if !rewritesWholeChains(data) {
		// Run again after a signal that came past its COMMIT, it would
		// put in a second copy of what it inserts: Update's deltas, Sync's
		// jumps into the built-in chains on a first start or a repair.
		// Failed, Update rewrites in full, and Sync's retry reads the
		// kernel back.
		return r.restoreOnce(data)
	}
	return runAgainIfSignalled(func() error { return r.restoreOnce(data) })
}

// rewritesWholeChains reports whether a second run of restore input data
// writes what the first did: each rule it adds goes to a chain it declares
// (":CHAIN - [0:0]", which flushes it, --noflush or not), and it inserts
// and deletes none. Sync's jump lines (-I INPUT 1 ..., -A PREROUTING ...,
// -D), in built-in chains that no restore of ours flushes, are not: run
// again, every jump was there twice, and Sync said nothing failed.
func rewritesWholeChains(data []byte) bool {
	declared := map[string]bool{}
	for line := range bytes.Lines(data) {
		line = bytes.TrimRight(line, "\n")
		switch {
		case len(line) == 0, line[0] == '#', string(line) == "COMMIT":
		case line[0] == '*':
			clear(declared)
		case line[0] == ':':
			name, _, _ := bytes.Cut(line[1:], []byte(" "))
			declared[string(name)] = true
		case bytes.HasPrefix(line, []byte("-A ")):
			name, _, _ := bytes.Cut(line[3:], []byte(" "))
			if !declared[string(name)] {
				return false
			}
		case bytes.HasPrefix(line, []byte("-X ")):
			// Run again, it fails (the chain is gone): an error, no change.
		default:
			return false
		}
	}
	return true
}

// restoreOnce runs iptables-restore with data once.
func (r *execRunner) restoreOnce(data []byte) error {
	var stderr bytes.Buffer
	cmd := r.restoreCmd(data, &stderr)
	if err := cmd.Run(); err != nil {
		return commandError(cmd, err, &stderr)
	}
	return nil
}

// signalledRuns is how many times a rule command killed by a signal is
// run in all (runAgainIfSignalled).
const signalledRuns = 3

// runAgainIfSignalled runs a rule command (run) again when a signal killed
// it, up to signalledRuns times. Such a command did none of its work or
// all of it: iptables-save only reads, and iptables-restore commits at
// COMMIT, with inputs that rewrite whole chains (Stop's, Sync's in the
// steady state), so a second run writes the same; those that do not
// (Update's deltas, Sync's with jump lines: rewritesWholeChains) are run
// once. The signal was rarely meant for it:
// one sent to the proxy's process group (timeout(1), a second Ctrl-C,
// kill -- -PGID) also reaches a command forked in the instant before it
// leaves that group (ownGroup's setpgid runs in the child, after the
// fork), and the stop's flush of the accepts of portal traffic failed
// with "signal: terminated".
func runAgainIfSignalled(run func() error) error {
	var err error
	for range signalledRuns {
		if err = run(); !killedBySignal(err) {
			return err
		}
	}
	return err
}

// killedBySignal reports whether err is a command's death by a signal:
// an exec.ExitError, or go-iptables' Error, which holds one by value.
func killedBySignal(err error) bool {
	var exit *exec.ExitError
	var ipt *goipt.Error
	var status any
	switch {
	case errors.As(err, &exit):
		status = exit.Sys()
	case errors.As(err, &ipt):
		status = ipt.Sys()
	default:
		return false
	}
	ws, ok := status.(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// restoreCmd is iptables-restore --noflush reading data.
func (r *execRunner) restoreCmd(data []byte, stderr *bytes.Buffer) *exec.Cmd {
	cmd := ownGroup(exec.Command(r.restore, append([]string{"--noflush"}, r.restoreWait...)...))
	cmd.Stdin, cmd.Stderr = bytes.NewReader(data), stderr
	return cmd
}

// ownGroup starts cmd in a process group of its own. A signal sent to the
// proxy's group (timeout(1) signals the proxy, then its group; a second
// Ctrl-C; kill -- -PGID) is meant for the proxy, whose stop then writes
// rules (the accepts of portal traffic flushed): in the proxy's group, the
// stop's own iptables-save and iptables-restore were killed by it, and the
// accepts stayed. Each write still ends on its own (-w 5 bounds its wait
// for the xtables lock), and its standard streams are pipes or /dev/null,
// never a terminal, which a process outside the foreground group could not
// use.
func ownGroup(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// concurrentRestorer is a Runner that can apply several restore inputs at
// once, each by its own iptables-restore. The real runner is one: on
// nf_tables two restores into one table overlap their parsing and the
// kernel retries the second commit on the new generation (the 20,000 nat
// rules of 10,000 Services: 0.42-0.50 s in two halves side by side
// against 0.58-0.63 s in one), while iptables-legacy's lock (-w)
// serializes them. The fake is not one, so unit tests stay deterministic.
type concurrentRestorer interface {
	// CanRestoreConcurrently is false where concurrent restores would only
	// queue (iptables-legacy: the second waits for the lock, polling it,
	// and then replaces the whole table again).
	CanRestoreConcurrently() bool
	RestoreConcurrently(inputs [][]byte) error
}

// CanRestoreConcurrently reports whether the binaries are iptables-nft.
func (r *execRunner) CanRestoreConcurrently() bool { return r.nftables }

// RestoreConcurrently starts one iptables-restore per input, then waits
// for all. Every process is started from the calling goroutine, so each
// runs in the network namespace of the caller's thread, as Restore does.
func (r *execRunner) RestoreConcurrently(inputs [][]byte) error {
	cmds := make([]*exec.Cmd, 0, len(inputs))
	stderrs := make([]bytes.Buffer, len(inputs))
	var errs []error
	for i, data := range inputs {
		cmd := r.restoreCmd(data, &stderrs[i])
		if err := cmd.Start(); err != nil {
			errs = append(errs, commandError(cmd, err, &stderrs[i]))
			break
		}
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		err := cmd.Wait()
		if killedBySignal(err) && rewritesWholeChains(inputs[i]) {
			// Once more alone (runAgainIfSignalled), from this goroutine,
			// when a second run writes the same (rewritesWholeChains).
			err = r.Restore(inputs[i])
		} else if err != nil {
			err = commandError(cmd, err, &stderrs[i])
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func commandError(cmd *exec.Cmd, err error, stderr *bytes.Buffer) error {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
}
