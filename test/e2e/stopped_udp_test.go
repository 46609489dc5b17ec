package e2e

import (
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// A UDP flow that the proxy served before its SIGTERM (a
// client with one long-lived socket: statsd, a DNS stub with a fixed
// port, a game client) keeps its conntrack entry; the stop only flushes
// accepts whose jumps take NEW packets, so the flow's next datagram goes
// to whoever bound the proxy port meanwhile, and the squatter's answer
// reached the client as the ClusterIP's; the stop now clears the
// entries of its UDP service ports, so the next datagram is a new flow,
// which KUBE-PROXY-PORT-REJECT refuses.
func TestStoppedProxyRefusesAKeptUDPFlow(t *testing.T) {
	c, p, e, s := servedWeb(t)
	dump := save(t, c.Node)
	udpPort, ok := proxyPort(dump, s.portName("dns"))
	if !ok {
		t.Fatalf("no proxy port in:\n%s", dump)
	}
	cl := e.node()
	var conn *net.UDPConn
	if err := cl.NS.Do(func() error {
		var err error
		conn, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(s.udp()))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, 128)
	if _, err := conn.Write([]byte("query")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := conn.Read(buf)
	t.Logf("before stop: answer %q err %v", buf[:n], err)

	p.Proc.Signal(syscall.SIGTERM)
	if err := p.Proc.Wait(10 * time.Second); err != nil {
		t.Fatalf("proxy after SIGTERM: %v", err)
	}
	udp, err := c.Node.ListenUDPAt(netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(udpPort)))
	if err != nil {
		t.Fatalf("binding the stopped proxy's UDP port %d: %v", udpPort, err)
	}
	defer udp.Close()
	got := make(chan string, 4)
	go func() {
		b := make([]byte, 64)
		for {
			n, from, err := udp.ReadFromUDPAddrPort(b)
			if err != nil {
				return
			}
			got <- string(b[:n]) + " from " + from.String()
			_, _ = udp.WriteToUDPAddrPort([]byte("forged answer"), from)
		}
	}()
	if _, err := conn.Write([]byte("second query")); err != nil {
		t.Logf("second write: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err = conn.Read(buf)
	t.Logf("after stop, same socket: answer %q err %v", buf[:n], err)
	select {
	case g := <-got:
		t.Errorf("squatter on the stopped proxy's UDP port %d received %q; client got %q (as from %s)", udpPort, g, buf[:n], s.udp())
	case <-time.After(500 * time.Millisecond):
	}
}
