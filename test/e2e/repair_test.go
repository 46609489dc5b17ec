package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// repairPeriod is the --iptables-sync-period of TestRepair, short so that
// the periodic repair can be watched.
const repairPeriod = 2 * time.Second

// oursSorted is every line of ours in the dump, sorted.
func oursSorted(dump string) []string {
	lines := oursIn(dump)
	slices.Sort(lines)
	return lines
}

// TestRepair damages the proxy's rules the way an admin or another agent
// might — a portal rule deleted, a chain flushed, a jump removed, a foreign
// rule added to our chain — and wants the periodic sync to restore exactly
// the rules it had, with traffic flowing again.
func TestRepair(t *testing.T) {
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 3, ClientIPsEach: 2})
	e := &env{c: c, bs: c.StartBackends(t, backendBin, backendPort), p: newProxy(t, c, "--iptables-sync-period", repairPeriod.String())}
	s := svc{name: "rr", clusterIP: "10.96.0.10", endpoints: ips(c, 0, 1, 2)}
	writeSvc(t, e.p.dir, s)
	e.p.Start(t, startWithin)
	e.pod1(0).WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
	e.node().WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
	good := oursSorted(save(t, c.Node))

	var jump string
	for _, line := range good {
		if strings.HasPrefix(line, "-A PREROUTING ") && strings.HasSuffix(line, "-j KUBE-PORTALS-CONTAINER") {
			jump = line
		}
	}
	if jump == "" {
		t.Fatalf("no PREROUTING jump to KUBE-PORTALS-CONTAINER:\n%s", strings.Join(good, "\n"))
	}
	damage := []string{
		"iptables -t nat -D KUBE-PORTALS-CONTAINER 1",
		"iptables -t nat -F KUBE-PORTALS-HOST",
		"iptables -t nat -D" + strings.TrimPrefix(jump, "-A"),
		"iptables -t nat -A KUBE-PORTALS-CONTAINER -d 10.96.9.9/32 -p tcp -j RETURN",
		"iptables -t filter -F KUBE-PROXY-PORT-GUARD",
	}
	for _, cmd := range damage {
		c.Node.MustExec("sh", "-c", cmd)
	}
	damaged := time.Now()
	if _, err := e.pod1(0).Ask("tcp", s.tcp(), harness.PollTimeout); err == nil {
		t.Errorf("traffic still flows with the portal rule and jump deleted; damage did not take")
	}

	limit := 2*repairPeriod + time.Second
	var now []string
	for {
		now = oursSorted(save(t, c.Node))
		if slices.Equal(now, good) {
			break
		}
		if time.Since(damaged) > limit {
			t.Fatalf("rules not repaired %v after damage (sync period %v)\nwant:\n%s\ngot:\n%s",
				limit, repairPeriod, strings.Join(good, "\n"), strings.Join(now, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	repaired := time.Since(damaged)
	checkEvenSplit(t, e.pod1(1), "tcp", s)
	checkEvenSplit(t, e.node(), "udp", s)
	if d := duplicateRules(save(t, c.Node)); len(d) > 0 {
		t.Errorf("duplicates after repair:\n%s", strings.Join(d, "\n"))
	}
	figure(t, "repair: %d damaging commands (rule deleted, chain flushed, jump deleted, foreign rule added, guard flushed); rules identical again after %d ms (sync period %v)",
		len(damage), repaired.Milliseconds(), repairPeriod)
}
