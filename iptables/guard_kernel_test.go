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
	ns := newNetns(t)
	inNetns(t, ns, "ip", "link", "set", "lo", "up")
	// Both ends of the pair stay in the namespace (no dummy module here).
	inNetns(t, ns, "ip", "link", "add", "kup0", "type", "veth", "peer", "name", "kup1")
	inNetns(t, ns, "ip", "addr", "add", "10.200.0.1/24", "dev", "kup0")
	inNetns(t, ns, "ip", "link", "set", "kup0", "up")
	inNetns(t, ns, "ip", "link", "set", "kup1", "up")
	inNetns(t, ns, "ip", "route", "add", "10.96.0.0/16", "dev", "kup0")

	runner := newNSRunner(t, ns, IPv4)
	var ln net.Listener
	var err error
	runner.th.do(func() { ln, err = net.Listen("tcp4", "0.0.0.0:0") })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	proxyPort := ln.Addr().(*net.TCPAddr).Port
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

	var pc net.PacketConn
	runner.th.do(func() { pc, err = net.ListenPacket("udp4", "0.0.0.0:0") })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	udpProxyPort := pc.LocalAddr().(*net.UDPAddr).Port
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
		if rule := GuardRuleCovering([]byte(saved), want.proto, want.port); !strings.Contains(rule, "-m multiport --dports") {
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
	served := false
	runner.th.do(func() {
		c, err := net.DialTimeout(network, addr, 500*time.Millisecond)
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(500 * time.Millisecond))
		if network == "udp4" {
			// A connected UDP socket only accepts the reply if it comes from
			// addr, i.e. conntrack undid the REDIRECT on the way back.
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

// TestKernelGuardSparesNodeFlows: the rules outlive the proxy, so a port
// that was a proxy port may later be the source port of one of the node's
// own connections. Its replies (not NEW) must pass the guard, while a NEW
// connection to that port that did not pass a portal is still dropped.
func TestKernelGuardSparesNodeFlows(t *testing.T) {
	requireRealIptables(t)
	ns := newNetns(t)
	inNetns(t, ns, "ip", "link", "set", "lo", "up")
	inNetns(t, ns, "ip", "link", "add", "kup0", "type", "veth", "peer", "name", "kup1")
	inNetns(t, ns, "ip", "addr", "add", "10.200.0.1/24", "dev", "kup0")
	inNetns(t, ns, "ip", "link", "set", "kup0", "up")
	inNetns(t, ns, "ip", "link", "set", "kup1", "up")
	inNetns(t, ns, "ip", "route", "add", "10.96.0.0/16", "dev", "kup0")
	runner := newNSRunner(t, ns, IPv4)

	// A server the node talks to, and two ports that were proxy ports of a
	// stopped proxy: nothing listens on them, their guard rules stay.
	var srv net.Listener
	var udpSrv net.PacketConn
	var err error
	runner.th.do(func() {
		if srv, err = net.Listen("tcp4", "10.200.0.1:0"); err == nil {
			udpSrv, err = net.ListenPacket("udp4", "10.200.0.1:0")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(); udpSrv.Close() })
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("k"))
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := udpSrv.ReadFrom(buf)
			if err != nil {
				return
			}
			udpSrv.WriteTo([]byte("k"), from)
		}
	}()
	const tcpPort, udpPort = 41234, 41235
	cfg := Config{Family: IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("10.200.0.1")}
	syncOK(t, New(runner, cfg), []Portal{
		{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: tcpPort},
		{Name: "default/dns:dns", Protocol: UDP, IP: netip.MustParseAddr("10.96.0.53"), Port: 53, ProxyPort: udpPort},
	})

	fromPort := func(network string, port int, to net.Addr) bool {
		served := false
		runner.th.do(func() {
			local := &net.TCPAddr{IP: net.IPv4(10, 200, 0, 1), Port: port}
			var la net.Addr = local
			if network == "udp4" {
				la = &net.UDPAddr{IP: local.IP, Port: port}
			}
			d := net.Dialer{LocalAddr: la, Timeout: 500 * time.Millisecond}
			c, err := d.Dial(network, to.String())
			if err != nil {
				return
			}
			if tc, ok := c.(*net.TCPConn); ok {
				// Closed with a reset, the port is free at once: a
				// close that sends its FIN before the server's could
				// leave it in TIME_WAIT, and the listen on the same
				// port below would fail (15 % of runs).
				_ = tc.SetLinger(0)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(500 * time.Millisecond))
			if network == "udp4" {
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
	if !fromPort("tcp4", tcpPort, srv.Addr()) {
		t.Errorf("TCP connection from former proxy port %d to %v got no reply", tcpPort, srv.Addr())
	}
	if !fromPort("udp4", udpPort, udpSrv.LocalAddr()) {
		t.Errorf("UDP exchange from former proxy port %d to %v got no reply", udpPort, udpSrv.LocalAddr())
	}

	// The same port, listening again, is still no back door.
	var ln net.Listener
	runner.th.do(func() { ln, err = net.Listen("tcp4", "0.0.0.0:"+strconv.Itoa(tcpPort)) })
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
	if dialServed(runner, "tcp4", "10.200.0.1:"+strconv.Itoa(tcpPort)) {
		t.Errorf("a direct NEW connection to proxy port %d was served", tcpPort)
	}
	if !dialServed(runner, "tcp4", "10.96.0.10:80") {
		t.Errorf("the portal to proxy port %d was not served", tcpPort)
	}
}
