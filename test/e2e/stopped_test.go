package e2e

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// TestStoppedProxyRefusesPortalTraffic: a proxy that stops (SIGTERM)
// leaves its portals in place (a restart keeps its ports and rewrites no
// rule), so they point at ports nobody holds. Another socket in the node
// that binds those ports (any local user can) received the Service's
// connections, from pods and from the node itself, and its UDP answers
// reached the clients as the ClusterIP's: the proxy left the portals'
// accepts in INPUT. It now flushes them at its stop, and the reject chain
// behind them refuses what the portals send there (a reset, ICMP port
// unreachable), as where nothing listens. The next start serves again.
func TestStoppedProxyRefusesPortalTraffic(t *testing.T) {
	c, p, e, s := servedWeb(t)
	dump := save(t, c.Node)
	tcpPort, ok1 := proxyPort(dump, s.portName("http"))
	udpPort, ok2 := proxyPort(dump, s.portName("dns"))
	if !ok1 || !ok2 {
		t.Fatalf("no proxy ports for %s in:\n%s", s.name, dump)
	}

	p.Proc.Signal(syscall.SIGTERM)
	if err := p.Proc.Wait(10 * time.Second); err != nil {
		t.Fatalf("proxy after SIGTERM: %v", err)
	}

	// The squatter: sockets of another process on the proxy ports.
	ln, err := c.Node.ListenTCP(netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(tcpPort)))
	if err != nil {
		t.Fatalf("binding the stopped proxy's TCP port %d: %v", tcpPort, err)
	}
	udp, err := c.Node.ListenUDPAt(netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(udpPort)))
	if err != nil {
		t.Fatalf("binding the stopped proxy's UDP port %d: %v", udpPort, err)
	}
	squatted := make(chan string, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			squatted <- "TCP connection from " + conn.RemoteAddr().String()
			conn.Close()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := udp.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			squatted <- "UDP datagram from " + from.String()
			_, _ = udp.WriteToUDPAddrPort([]byte("forged answer"), from)
		}
	}()

	for _, cl := range []harness.Client{e.pod1(0), e.node()} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := cl.NS.DialTCP(ctx, cl.Src, s.tcp())
		cancel()
		if err == nil {
			conn.Close()
		}
		figure(t, "stopped proxy, TCP %s from %s: %v", s.tcp(), cl.Label, err)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("TCP %s from %s while the proxy is stopped: %v; want refused", s.tcp(), cl.Label, err)
		}
		answer, err := askUDPConnected(cl, s.udp())
		figure(t, "stopped proxy, UDP %s from %s: answer %q, err %v", s.udp(), cl.Label, answer, err)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("UDP %s from %s while the proxy is stopped: answer %q, err %v; want refused", s.udp(), cl.Label, answer, err)
		}
	}
	ln.Close()
	udp.Close()
	for {
		select {
		case got := <-squatted:
			t.Errorf("the socket on the stopped proxy's port received a %s", got)
			continue
		default:
		}
		break
	}

	p.Start(t, startWithin)
	for _, cl := range []harness.Client{e.pod1(0), e.node()} {
		cl.WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
		cl.WaitServed(t, "udp", s.udp(), time.Now(), startBudget)
	}
	if after := save(t, c.Node); !equalPortals(dump, after) {
		t.Errorf("the restart changed the portals; before:\n%s\nafter:\n%s", dump, after)
	}
}

// askUDPConnected sends one datagram from a connected socket, so an ICMP
// port unreachable shows as ECONNREFUSED, and returns the answer.
func askUDPConnected(cl harness.Client, dst netip.AddrPort) (string, error) {
	var c *net.UDPConn
	err := cl.NS.Do(func() error {
		var laddr *net.UDPAddr
		if cl.Src.IsValid() {
			laddr = &net.UDPAddr{IP: cl.Src.AsSlice()}
		}
		var err error
		c, err = net.DialUDP("udp4", laddr, net.UDPAddrFromAddrPort(dst))
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write([]byte("query")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// equalPortals reports whether two dumps hold the same nat rules of ours.
func equalPortals(a, b string) bool {
	var na, nb []string
	for _, l := range oursIn(a) {
		if targetPort.MatchString(l) {
			na = append(na, l)
		}
	}
	for _, l := range oursIn(b) {
		if targetPort.MatchString(l) {
			nb = append(nb, l)
		}
	}
	if len(na) != len(nb) || len(na) == 0 {
		return false
	}
	for i := range na {
		if na[i] != nb[i] {
			return false
		}
	}
	return true
}
