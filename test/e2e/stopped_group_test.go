package e2e

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStopSignalledWithItsGroupFlushesTheAccepts: `timeout(1)`, a second
// Ctrl-C, or a script's `kill -- -PGID` signal the proxy's whole process
// group, not only the proxy. The stop's own rule write (iptables-save and
// iptables-restore, children of the proxy, in its group) was killed by the
// signal meant for the proxy, so the accepts of portal traffic stayed in
// INPUT ("Failed to flush the accepts ... signal: terminated"): every run
// under an expiring `timeout`. The rule writes run in a group of their own.
func TestStopSignalledWithItsGroupFlushesTheAccepts(t *testing.T) {
	requireSuite(t)
	setsid, err := exec.LookPath("setsid")
	if err != nil {
		t.Skip("needs setsid (util-linux) to give the proxy a process group of its own")
	}
	c, p, _, _ := servedWebWith(t, func(p *proxy) {
		// ip netns exec execs setsid, not a group leader, which makes
		// itself one and execs the proxy: the proxy leads its own group,
		// as under timeout(1), and signalling it spares the test.
		p.Args = append([]string{p.Bin}, p.Args...)
		p.Bin = setsid
	})
	if !strings.Contains(save(t, c.Node), "-A KUBE-PORTALS-NON-LOCAL ") {
		t.Fatalf("no accept of portal traffic before the stop:\n%s", save(t, c.Node))
	}
	pid := p.Proc.Pid
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
		t.Fatalf("the proxy (pid %d) does not lead its process group (%d, %v): not signalling it", pid, pgid, err)
	}

	// As timeout(1) does: the proxy, then its group, again and again
	// until it has exited (the pause paces the signals; nothing waits on it).
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for !p.Proc.Exited() {
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not stop within 10 s of SIGTERM")
		}
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		time.Sleep(time.Millisecond)
	}

	if lines := p.LogLines("Failed to flush the accepts"); len(lines) > 0 {
		t.Errorf("the stop's rule write was killed:\n%s", strings.Join(lines, "\n"))
	}
	if dump := save(t, c.Node); strings.Contains(dump, "-A KUBE-PORTALS-NON-LOCAL ") {
		t.Errorf("the accepts of portal traffic stayed after the stop:\n%s", dump)
	}
}
