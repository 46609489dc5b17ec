package iptables

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// This file gives the real-kernel tests a network namespace of their own:
// the namespace, a thread living in it, and a Runner whose commands run on
// that thread (children forked there inherit its namespace), so the host's
// own rules are never touched.

// requireRealIptables skips unless the test can create namespaces and run
// the iptables binaries.
func requireRealIptables(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("real-kernel iptables test: skipped with -short (make unit); make test runs it")
	}
	if os.Geteuid() != 0 {
		t.Skip("real-kernel iptables test needs root (it creates a network namespace); run as root to include it")
	}
	for _, bin := range []string{"ip", "iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("real-kernel iptables test needs %s (apt-get install -y iptables iproute2): %v", bin, err)
		}
	}
}

// newNetns creates a network namespace with a random name, removed when
// the test ends, and returns its name.
func newNetns(t testing.TB) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "kup-ipt-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return name
}

// inNetns runs a command inside the namespace and returns its output.
func inNetns(t testing.TB, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// nsThread is an OS thread moved into a namespace; work sent to it runs
// there. The thread is never unlocked, so when it stops the runtime
// discards it instead of reusing a thread in the wrong namespace.
type nsThread struct {
	work chan func()
}

func startNSThread(t testing.TB, ns string) *nsThread {
	t.Helper()
	th := &nsThread{work: make(chan func())}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		ready <- err
		if err != nil {
			return
		}
		for f := range th.work {
			f()
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("entering namespace %s: %v", ns, err)
	}
	t.Cleanup(func() { close(th.work) })
	return th
}

// do runs f on the namespace thread and waits for it.
func (th *nsThread) do(f func()) {
	done := make(chan struct{})
	th.work <- func() { defer close(done); f() }
	<-done
}

// nsRunner runs every call of the real Runner on the namespace thread and
// counts restores, so tests can tell whether a sync wrote anything.
type nsRunner struct {
	th       *nsThread
	real     Runner
	restores atomic.Int32
}

func newNSRunner(t testing.TB, ns string, f Family) *nsRunner {
	t.Helper()
	r := &nsRunner{th: startNSThread(t, ns)}
	var err error
	r.th.do(func() { r.real, err = NewRunner(f) })
	if err != nil {
		t.Fatalf("NewRunner(%v): %v", f, err)
	}
	return r
}

func (r *nsRunner) Family() Family { return r.real.Family() }

func (r *nsRunner) ChainExists(table Table, chain string) (ok bool, err error) {
	r.th.do(func() { ok, err = r.real.ChainExists(table, chain) })
	return
}

func (r *nsRunner) DeleteChain(table Table, chain string) (err error) {
	r.th.do(func() { err = r.real.DeleteChain(table, chain) })
	return
}

func (r *nsRunner) RuleExists(table Table, chain string, args ...string) (ok bool, err error) {
	r.th.do(func() { ok, err = r.real.RuleExists(table, chain, args...) })
	return
}

func (r *nsRunner) InsertRule(table Table, chain string, pos int, args ...string) (err error) {
	r.th.do(func() { err = r.real.InsertRule(table, chain, pos, args...) })
	return
}

func (r *nsRunner) AppendRule(table Table, chain string, args ...string) (err error) {
	r.th.do(func() { err = r.real.AppendRule(table, chain, args...) })
	return
}

func (r *nsRunner) DeleteRule(table Table, chain string, args ...string) (err error) {
	r.th.do(func() { err = r.real.DeleteRule(table, chain, args...) })
	return
}

func (r *nsRunner) Save(tables ...Table) (out []byte, err error) {
	r.th.do(func() { out, err = r.real.Save(tables...) })
	return
}

func (r *nsRunner) Restore(data []byte) (err error) {
	r.restores.Add(1)
	r.th.do(func() { err = r.real.Restore(data) })
	return
}

func (r *nsRunner) ListNftTables() (names []string, err error) {
	r.th.do(func() { names, err = r.real.(nftTableLister).ListNftTables() })
	return
}
