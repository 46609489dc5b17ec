package e2e

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestNodeRenumbered: the node IP came from the default route (no
// --node-ip, no Node object) and the node is renumbered, as a DHCP lease
// may do. The portals kept DNATing to the old address and every Service of
// the node was lost, /healthz 200 and nothing logged. Now the proxy exits
// 1 within two looks (5 s apart), and the restarted one serves through
// the new address.
func TestNodeRenumbered(t *testing.T) {
	c, p, e, s := servedWeb(t)

	renumbered := netip.MustParseAddr("10.77.1.9")
	// (Deleting the old primary first: it would take a secondary of its
	// subnet with it.)
	c.Node.MustIP("addr", "del", netip.PrefixFrom(c.NodeIP, 24).String(), "dev", "kb0")
	c.Node.MustIP("addr", "add", netip.PrefixFrom(renumbered, 24).String(), "dev", "kb0")
	c.Node.MustIP("route", "replace", "default", "via", "10.77.1.2")
	began := time.Now()
	err := p.Proc.Wait(20 * time.Second)
	figure(t, "proxy after the node was renumbered: %v after %v", err, time.Since(began).Round(time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("proxy after renumbering: %v, want exit status 1\n%s", err, p.Proc.Output())
	}
	if !strings.Contains(p.Proc.Output(), "no longer an address of this node") {
		t.Errorf("the exit does not say why:\n%s", p.Proc.Output())
	}

	p.Start(t, startWithin)
	e.pod1(0).WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
	if rules := save(t, c.Node); !strings.Contains(rules, "--to-destination "+renumbered.String()+":") {
		t.Errorf("the restarted proxy's portals do not DNAT to %v:\n%s", renumbered, rules)
	}
}
