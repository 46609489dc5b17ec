package netns

import (
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/lockedbuf"
)

// Proc is a process started inside a namespace. `ip netns exec` execs the
// program in place, so Pid is the program itself and killing it by PID is
// exact.
type Proc struct {
	Name string
	Pid  int

	cmd  *exec.Cmd
	out  *lockedbuf.Buffer
	done chan struct{}
	err  error
}

// Start runs bin with args inside the namespace. Its stdout and stderr are
// kept in memory (Output) and dumped into the test log if the test fails. The
// process is killed (SIGKILL, by PID) and reaped in t.Cleanup unless it has
// already exited.
func (n *NS) Start(name, bin string, args ...string) *Proc {
	n.t.Helper()
	buf := &lockedbuf.Buffer{}
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, bin}, args...)...)
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("netns: start %s in %s: %v", name, n.Name, err)
	}
	p := &Proc{Name: name, Pid: cmd.Process.Pid, cmd: cmd, out: buf, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t := n.t
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("---- output of %s (pid %d) ----\n%s", p.Name, p.Pid, p.Output())
		}
	})
	return p
}

// Signal sends sig to the process if it is still running.
func (p *Proc) Signal(sig syscall.Signal) {
	if !p.Exited() {
		_ = p.cmd.Process.Signal(sig) // pidfd-backed: never hits a recycled PID
	}
}

// Kill sends SIGKILL and waits until the process is reaped.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Wait waits up to d for the process to exit and returns its exit error.
func (p *Proc) Wait(d time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		return fmt.Errorf("%s (pid %d) still running after %v", p.Name, p.Pid, d)
	}
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Output is everything the process has written so far.
func (p *Proc) Output() string { return p.out.String() }
