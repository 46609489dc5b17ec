package netns_test

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

func TestMain(m *testing.M) { harness.Main(m) } // removes the backend binary it built

func askTCP(t *testing.T, from *netns.NS, src netip.Addr, dst netip.AddrPort) backend.Answer {
	t.Helper()
	a, err := harness.Client{NS: from, Src: src}.AskTCP(dst, 2*time.Second)
	if err != nil {
		t.Fatalf("ask %s from %s (src %v): %v", dst, from.Name, src, err)
	}
	return a
}

// TestClusterTopology proves the lab itself: every client namespace reaches
// every backend directly (TCP and UDP) with its own source address, the dead
// address refuses, and after the test nothing is left: no namespace, no
// process.
func TestClusterTopology(t *testing.T) {
	netns.Require(t)
	bin := harness.BackendBinary(t)

	var names []string
	var pids []int
	t.Run("lab", func(t *testing.T) {
		c := netns.NewCluster(t, netns.ClusterOptions{})
		for _, ns := range []*netns.NS{c.Node, c.Pod1, c.Pod2, c.Backends, c.External} {
			names = append(names, ns.Name)
		}
		bs := c.StartBackends(t, bin, 8080)
		for _, b := range bs {
			pids = append(pids, b.Proc.Pid)
		}
		clients := []struct {
			ns  *netns.NS
			src netip.Addr
		}{
			{c.Node, netip.Addr{}},
			{c.Pod1, c.Pod1IPs[0]},
			{c.Pod1, c.Pod1IPs[len(c.Pod1IPs)-1]},
			{c.Pod2, c.Pod2IPs[3]},
			{c.External, netip.Addr{}},
		}
		for _, cl := range clients {
			for _, b := range bs {
				a := askTCP(t, cl.ns, cl.src, b.Addr)
				if a.Backend != b.Name {
					t.Errorf("tcp %s from %s: answered by %q", b.Addr, cl.ns.Name, a.Backend)
				}
				if cl.src.IsValid() && !strings.HasPrefix(a.Remote, cl.src.String()+":") {
					t.Errorf("tcp %s from %s: backend saw %s, want source %s", b.Addr, cl.ns.Name, a.Remote, cl.src)
				}
				ua, from, err := harness.Client{NS: cl.ns, Src: cl.src}.AskUDP(b.Addr, 2*time.Second)
				if err != nil || ua.Backend != b.Name || from != b.Addr {
					t.Errorf("udp %s from %s: answer %+v from %s, err %v", b.Addr, cl.ns.Name, ua, from, err)
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if conn, err := c.Pod1.DialTCP(ctx, netip.Addr{}, netip.AddrPortFrom(c.DeadIP, 8080)); err == nil {
			conn.Close()
			t.Errorf("dead address %s accepted a connection", c.DeadIP)
		} else if !strings.Contains(err.Error(), "refused") {
			t.Errorf("dead address %s: want connection refused, got %v", c.DeadIP, err)
		}
		if got := strings.TrimSpace(c.Node.MustExec("cat", "/proc/sys/net/ipv4/ip_forward")); got != "1" {
			t.Errorf("node ip_forward = %q", got)
		}
		t.Logf("lab %s: node %s, backends %v, dead %s, %d client IPs per pod",
			c.Lab.Suffix, c.NodeIP, c.BackendIPs, c.DeadIP, len(c.Pod1IPs))
	})

	for _, n := range names {
		if netns.Exists(n) {
			t.Errorf("namespace %s left behind", n)
			_ = exec.Command("ip", "netns", "del", n).Run()
		}
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("backend pid %d still running", pid)
		}
	}
}
