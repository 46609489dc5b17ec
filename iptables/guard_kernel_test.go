package iptables

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKernelGuard proves the "no back door" rule with real traffic inside a
// namespace: a connection that came through a portal (ClusterIP or
// NodePort) reaches the proxy socket, a direct one to the proxy port is
// dropped, and that while the proxy socket listens on every address.
func TestKernelGuard(t *testing.T) {
	requireRealIptables(t)
	ns, runner := nodeNamespace(t)
	proxyPort := answerTCP(t, runner, "0.0.0.0:0").Addr().(*net.TCPAddr).Port
	udpProxyPort := answerUDP(t, runner, "0.0.0.0:0").LocalAddr().(*net.UDPAddr).Port

	cfg := Config{Family: IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("10.200.0.1")}
	portals := []Portal{
		{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: proxyPort},
		{Name: "default/web:http", Protocol: TCP, Port: 30080, NodePort: true, ProxyPort: proxyPort},
		{Name: "default/dns:dns", Protocol: UDP, IP: netip.MustParseAddr("10.96.0.53"), Port: 53, ProxyPort: udpProxyPort},
		// Services whose proxy ports share a guard block (guard.go) with
		// the two above, so that their guard rules are multiport ones.
		{Name: "default/web2:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.11"), Port: 80, ProxyPort: proxyPort ^ 1},
		{Name: "default/dns2:dns", Protocol: UDP, IP: netip.MustParseAddr("10.96.0.54"), Port: 53, ProxyPort: udpProxyPort ^ 1},
	}
	// Enough other Services for the guard to group its ports.
	for i := range guardGroupAbove {
		portals = append(portals, Portal{Name: "default/many-" + strconv.Itoa(i) + ":http", Protocol: TCP,
			IP: netip.AddrFrom4([4]byte{10, 96, 1 + byte(i>>8), byte(i)}), Port: 80, ProxyPort: 1100 + i})
	}
	syncOK(t, New(runner, cfg), portals)
	saved := inNetns(t, ns, "iptables-save", "-t", "filter")
	for _, want := range []struct {
		proto Protocol
		port  int
	}{{TCP, proxyPort}, {UDP, udpProxyPort}} {
		if rule := GuardRuleCovering([]byte(saved), ChainProxyPortGuard, want.proto, want.port); !strings.Contains(rule, "-m multiport --dports") {
			t.Fatalf("guard rule of %s %d is %q, want a multiport rule:\n%s", want.proto, want.port, rule, saved)
		}
	}

	tests := []struct {
		name    string
		network string
		addr    string
		served  bool
	}{
		{"ClusterIP portal", "tcp4", "10.96.0.10:80", true},
		{"NodePort on the node IP", "tcp4", "10.200.0.1:30080", true},
		{"proxy port on the node IP", "tcp4", "10.200.0.1:" + strconv.Itoa(proxyPort), false},
		{"proxy port on loopback", "tcp4", "127.0.0.1:" + strconv.Itoa(proxyPort), false},
		{"UDP ClusterIP portal, reply from the ClusterIP", "udp4", "10.96.0.53:53", true},
		{"UDP proxy port on the node IP", "udp4", "10.200.0.1:" + strconv.Itoa(udpProxyPort), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if served := dialServed(runner, tt.network, tt.addr); served != tt.served {
				t.Errorf("dial %s: served=%v, want %v", tt.addr, served, tt.served)
			}
		})
	}

	// Control: without the guard the same direct connection gets through,
	// so the drop above is the guard's doing and not a routing accident.
	inNetns(t, ns, "iptables", "-t", "filter", "-F", ChainProxyPortGuard)
	if direct := "10.200.0.1:" + strconv.Itoa(proxyPort); !dialServed(runner, "tcp4", direct) {
		t.Errorf("dial %s without the guard was not served", direct)
	}
}

// dialServed connects (TCP) or sends a datagram (UDP) from the namespace
// thread and reports whether the proxy socket answered. A dropped packet
// shows up as a timeout; a served one answers at once.
func dialServed(runner *nsRunner, network, addr string) bool {
	return dialServedFrom(runner, network, netip.AddrPort{}, addr)
}

// dialServedFrom is dialServed from a chosen local address and port (any
// part left zero: the kernel's choice).
func dialServedFrom(runner *nsRunner, network string, from netip.AddrPort, to string) bool {
	served := false
	runner.th.do(func() {
		d := net.Dialer{Timeout: 500 * time.Millisecond}
		if from.Addr().IsValid() {
			if network == "udp4" {
				d.LocalAddr = net.UDPAddrFromAddrPort(from)
			} else {
				d.LocalAddr = net.TCPAddrFromAddrPort(from)
			}
		}
		c, err := d.Dial(network, to)
		if err != nil {
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			// Closed with a reset, the port is free at once: a close that
			// sends its FIN before the server's could leave a chosen port in
			// TIME_WAIT, and a listen on it next would fail (15 % of runs).
			_ = tc.SetLinger(0)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(500 * time.Millisecond))
		if network == "udp4" {
			// A connected UDP socket only accepts the reply if it comes from
			// the address it sent to, i.e. conntrack undid the NAT.
			if _, err := c.Write([]byte("q")); err != nil {
				return
			}
		}
		got := make([]byte, 1)
		_, err = c.Read(got)
		served = err == nil && string(got) == "k"
	})
	return served
}

// nodeNamespace makes a namespace that stands for a node: loopback up, the
// node IP 10.200.0.1/24 on a veth pair whose both ends stay inside (no
// dummy module here), the ClusterIP range routed out of it; and a runner
// working in it.
func nodeNamespace(t *testing.T) (string, *nsRunner) {
	ns := newNetns(t)
	inNetns(t, ns, "ip", "link", "set", "lo", "up")
	inNetns(t, ns, "ip", "link", "add", "kup0", "type", "veth", "peer", "name", "kup1")
	inNetns(t, ns, "ip", "addr", "add", "10.200.0.1/24", "dev", "kup0")
	inNetns(t, ns, "ip", "link", "set", "kup0", "up")
	inNetns(t, ns, "ip", "link", "set", "kup1", "up")
	inNetns(t, ns, "ip", "route", "add", "10.96.0.0/16", "dev", "kup0")
	return ns, newNSRunner(t, ns, IPv4)
}

// answerTCP listens on addr in the runner's namespace and answers every
// connection with "k", closed with the test.
func answerTCP(t *testing.T, runner *nsRunner, addr string) net.Listener {
	var ln net.Listener
	var err error
	runner.th.do(func() { ln, err = net.Listen("tcp4", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("k"))
			c.Close()
		}
	}()
	return ln
}

// answerUDP is answerTCP for datagrams.
func answerUDP(t *testing.T, runner *nsRunner, addr string) net.PacketConn {
	var pc net.PacketConn
	var err error
	runner.th.do(func() { pc, err = net.ListenPacket("udp4", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte("k"), from)
		}
	}()
	return pc
}

// TestKernelGuardSparesNodeFlows: the rules outlive the proxy, so a port
// that was a proxy port may later be the source port of one of the node's
// own connections. Its replies (not NEW) must pass the guard, while a NEW
// connection to that port that did not pass a portal is still dropped.
func TestKernelGuardSparesNodeFlows(t *testing.T) {
	requireRealIptables(t)
	_, runner := nodeNamespace(t)

	// A server the node talks to, and two ports that were proxy ports of a
	// stopped proxy: nothing listens on them, their guard rules stay.
	srv, udpSrv := answerTCP(t, runner, "10.200.0.1:0"), answerUDP(t, runner, "10.200.0.1:0")
	const tcpPort, udpPort = 41234, 41235
	cfg := Config{Family: IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("10.200.0.1")}
	syncOK(t, New(runner, cfg), []Portal{
		{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: tcpPort},
		{Name: "default/dns:dns", Protocol: UDP, IP: netip.MustParseAddr("10.96.0.53"), Port: 53, ProxyPort: udpPort},
	})

	node := netip.MustParseAddr("10.200.0.1")
	fromPort := func(network string, port int, to net.Addr) bool {
		return dialServedFrom(runner, network, netip.AddrPortFrom(node, uint16(port)), to.String())
	}
	if !fromPort("tcp4", tcpPort, srv.Addr()) {
		t.Errorf("TCP connection from former proxy port %d to %v got no reply", tcpPort, srv.Addr())
	}
	if !fromPort("udp4", udpPort, udpSrv.LocalAddr()) {
		t.Errorf("UDP exchange from former proxy port %d to %v got no reply", udpPort, udpSrv.LocalAddr())
	}

	// The same port, listening again, is still no back door.
	answerTCP(t, runner, "0.0.0.0:"+strconv.Itoa(tcpPort))
	if dialServed(runner, "tcp4", "10.200.0.1:"+strconv.Itoa(tcpPort)) {
		t.Errorf("a direct NEW connection to proxy port %d was served", tcpPort)
	}
	if !dialServed(runner, "tcp4", "10.96.0.10:80") {
		t.Errorf("the portal to proxy port %d was not served", tcpPort)
	}
}
