package demo

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/lockedbuf"
)

// Command is how to run kube-userspace-proxy itself: the demo --netns
// starts it as a process inside the node namespace, since a process's
// sockets and iptables calls belong to the namespace it runs in.
type Command struct {
	Path string
	Env  []string // nil: this process's environment
}

// proxyProcess is the proxy running in the node namespace.
type proxyProcess struct {
	cmd  *exec.Cmd
	out  lockedbuf.Buffer
	done chan error
}

// startProxyProcess runs cmd with args in ns. The process is killed if the
// demo dies (Pdeathsig). Linux sends that signal when the *thread* that
// forked the child ends, and Go ends a thread whenever a goroutine locked to
// it exits (as netNS.do's do), so the child is forked from a thread locked
// to one goroutine that lives until the child has been reaped.
func startProxyProcess(ns netNS, c Command, args []string) (*proxyProcess, error) {
	p := &proxyProcess{done: make(chan error, 1)}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command("ip", append([]string{"netns", "exec", ns.name, c.Path}, args...)...)
		cmd.Env = c.Env
		cmd.Stdout, cmd.Stderr = &p.out, &p.out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		p.cmd = cmd
		started <- nil
		p.done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// stop ends the proxy as a user would (SIGTERM, which `ip netns exec`
// passes on, since it execs the program in place) and waits; after 5 s it
// kills it.
func (p *proxyProcess) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exited reports, without waiting, whether the process has ended, and how.
func (p *proxyProcess) exited() (bool, error) {
	select {
	case err := <-p.done:
		p.done <- err
		return true, err
	default:
		return false, nil
	}
}

// waitUp waits until cond holds or the process ends.
func (p *proxyProcess) waitUp(ctx context.Context, cond func() bool) error {
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if gone, err := p.exited(); gone {
			return fmt.Errorf("the proxy stopped: %v\n%s", err, p.out.String())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the proxy did not serve the demo's Services within %v:\n%s", waitLimit, p.out.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

var errNotRoot = errors.New("demo --netns needs root (it creates network namespaces and iptables rules); run it with sudo, or without --netns")
