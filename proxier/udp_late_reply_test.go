package proxier

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// A session's backend socket is a connected UDP socket whose local port the
// kernel picked at random from the ephemeral range. When the session closes
// (its idle timeout, or evicted at the cap) the port is free at once, and
// the next session to the same endpoint could get it: a reply the endpoint
// sent the closed session late (a DNS answer slower than --udp-timeout)
// then arrived on the new session's socket and was relayed to its client,
// another pod (through a node with the default range and a backend
// answering after 0.4 s, 3,000 one-query clients in a second: 19 answers
// reached the wrong client). A new session passes over the ports freed
// most recently. The proxier runs in a child process in a namespace of its
// own with a small ephemeral range, where the kernel hands a freed port
// out again soon (its sessions' sockets are opened by its relay loop, on
// any thread: the whole process must be in the namespace).
func TestUDPLateReplyNotRelayedToAnotherClient(t *testing.T) {
	if os.Getenv("KUP_LATE_REPLY_CHILD") != "" {
		t.Skip("this is the child")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	netns.Require(t, "ip")
	ns := netns.New(t).NS("late")
	ns.MustIP("link", "set", "lo", "up")
	ns.Sysctl("net.ipv4.ip_local_port_range", "40000 40039")
	cmd := exec.Command("ip", "netns", "exec", ns.Name, os.Args[0],
		"-test.run=^TestUDPLateReplyChild$", "-test.v", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), "KUP_LATE_REPLY_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestUDPLateReplyChild") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// TestUDPLateReplyChild is TestUDPLateReplyNotRelayedToAnotherClient's
// proxier, run by it in its namespace (40 ephemeral ports).
func TestUDPLateReplyChild(t *testing.T) {
	if os.Getenv("KUP_LATE_REPLY_CHILD") == "" {
		t.Skip("run by TestUDPLateReplyNotRelayedToAnotherClient")
	}
	// Every socket of the test has a port outside the range: only the
	// sessions' take ports from it.
	be, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 20053})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	p := newTestProxier(t, Options{UDPIdleTimeout: time.Hour, UDPMaxSessionsPerPort: 20})
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, "127.0.0.2:20053"))
	p.Sync()
	proxy := netip.MustParseAddrPort(proxyAddr(t, p, "default/dns:p"))
	sock := p.active[p.lbName("default/dns:p")].socket.(*udpProxySocket)

	client := func(port int) *net.UDPConn {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}, net.UDPAddrFromAddrPort(proxy))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// send has the client's datagram relayed and returns the local port
	// of its session's backend socket, where the endpoint answers.
	buf := make([]byte, 64)
	send := func(c *net.UDPConn) uint16 {
		t.Helper()
		if _, err := c.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		_ = be.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, from, err := be.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("the endpoint got no datagram: %v", err)
		}
		return from.Port()
	}
	closeSessions := func() {
		sock.mu.Lock()
		defer sock.mu.Unlock()
		sock.sessions.each(sock.closeSessionLocked)
	}

	for round := range 40 {
		a := client(21000)
		pa := send(a)
		// Its session closes, as at the idle timeout or the cap; the
		// endpoint still owes it an answer, sent to port pa.
		closeSessions()
		var bs []*net.UDPConn
		for i := range 8 {
			b := client(21001 + i)
			bs = append(bs, b)
			if pb := send(b); pb == pa {
				t.Fatalf("round %d: client %v's session has local port %d, which client %v's session freed just before: "+
					"the endpoint's late answer to %v would reach %v", round, b.LocalAddr(), pb, a.LocalAddr(), a.LocalAddr(), b.LocalAddr())
			}
		}
		closeSessions()
		a.Close()
		for _, b := range bs {
			b.Close()
		}
	}
}
