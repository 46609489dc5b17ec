package netns

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// NS is one named network namespace of a Lab.
type NS struct {
	t    testing.TB
	Name string
}

// Path is the bind-mount that pins the namespace, as `ip netns` creates it.
func (n *NS) Path() string { return "/run/netns/" + n.Name }

// Exec runs a command inside the namespace and returns its combined output.
func (n *NS) Exec(name string, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n.Name, err, out)
	}
	return string(out), nil
}

// MustExec is Exec that fails the test on error.
func (n *NS) MustExec(name string, args ...string) string {
	n.t.Helper()
	out, err := n.Exec(name, args...)
	if err != nil {
		n.t.Fatalf("netns: %v", err)
	}
	return out
}

// MustIP runs `ip -n NS args...` and fails the test on error.
func (n *NS) MustIP(args ...string) {
	n.t.Helper()
	full := append([]string{"-n", n.Name}, args...)
	if out, err := exec.Command("ip", full...).CombinedOutput(); err != nil {
		n.t.Fatalf("netns: ip %s: %v: %s", strings.Join(full, " "), err, out)
	}
}

// Sysctl writes one net.* sysctl inside the namespace (for example
// "net.ipv4.ip_forward", "1").
func (n *NS) Sysctl(key, value string) {
	n.t.Helper()
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	err := n.Do(func() error { return os.WriteFile(path, []byte(value), 0o644) })
	if err != nil {
		n.t.Fatalf("netns: sysctl %s=%s in %s: %v", key, value, n.Name, err)
	}
}

// Do runs fn on an OS thread that has joined the namespace. Sockets that fn
// creates belong to the namespace for their whole life and may be used from
// any goroutine afterwards.
//
// The thread is never returned to the Go scheduler: the goroutine exits while
// still locked, which makes the runtime destroy the thread instead of reusing
// it in the wrong namespace.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // deliberately never unlocked, see above
		f, err := os.Open(n.Path())
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			errc <- fmt.Errorf("setns %s: %w", n.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
