package iptables

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestKernelLBSourceRanges proves loadBalancerSourceRanges with real
// traffic inside a namespace: the node's own connections to a LoadBalancer
// IP, each from a chosen source address, are served from an allowed range
// and dropped from any other, while the ClusterIP on the same proxy socket
// serves every source; for TCP and UDP. The rules also read back exactly as
// rendered (an unchanged sync writes nothing).
func TestKernelLBSourceRanges(t *testing.T) {
	requireRealIptables(t)
	ns := newNetns(t)
	inNetns(t, ns, "ip", "link", "set", "lo", "up")
	inNetns(t, ns, "ip", "link", "add", "kup0", "type", "veth", "peer", "name", "kup1")
	for _, a := range []string{"10.200.0.1/24", "10.1.0.5/32", "10.2.0.5/32"} {
		inNetns(t, ns, "ip", "addr", "add", a, "dev", "kup0")
	}
	inNetns(t, ns, "ip", "link", "set", "kup0", "up")
	inNetns(t, ns, "ip", "link", "set", "kup1", "up")
	inNetns(t, ns, "ip", "route", "add", "10.96.0.0/16", "dev", "kup0")
	inNetns(t, ns, "ip", "route", "add", "198.51.100.0/24", "dev", "kup0")

	runner := newNSRunner(t, ns, IPv4)
	var ln net.Listener
	var pc net.PacketConn
	var err error
	runner.th.do(func() {
		if ln, err = net.Listen("tcp4", "0.0.0.0:0"); err == nil {
			// On the node IP, the portals' DNAT target: a socket on every
			// address answers a client on 10.1.0.5 from 10.1.0.5, which
			// conntrack cannot match to the DNATed flow.
			pc, err = net.ListenPacket("udp4", "10.200.0.1:0")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
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
	tcpPort, udpPort := ln.Addr().(*net.TCPAddr).Port, pc.LocalAddr().(*net.UDPAddr).Port

	allowed := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00:10::/64")}
	lb := netip.MustParseAddr("198.51.100.20")
	portals := []Portal{
		{Name: "default/lb:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: tcpPort},
		{Name: "default/lb:http", Protocol: TCP, IP: lb, Port: 80, ProxyPort: tcpPort, SourceRanges: allowed},
		{Name: "default/lb:dns", Protocol: UDP, IP: netip.MustParseAddr("10.96.0.10"), Port: 53, ProxyPort: udpPort},
		{Name: "default/lb:dns", Protocol: UDP, IP: lb, Port: 53, ProxyPort: udpPort, SourceRanges: allowed},
	}
	cfg := Config{Family: IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("10.200.0.1")}
	r := New(runner, cfg)
	syncOK(t, r, portals)
	assertKernelState(t, ns, r, portals)
	runner.restores.Store(0)
	syncOK(t, r, portals)
	if n := runner.restores.Load(); n != 0 || len(r.printed) != 0 {
		t.Errorf("unchanged sync ran %d restores (kernel printed differently: %+v), want 0", n, r.printed)
	}

	tests := []struct {
		name, network, from, to string
		served                  bool
	}{
		{"LB IP from an allowed range", "tcp4", "10.1.0.5", "198.51.100.20:80", true},
		{"LB IP from outside the ranges", "tcp4", "10.2.0.5", "198.51.100.20:80", false},
		{"LB IP from the node IP, outside the ranges", "tcp4", "10.200.0.1", "198.51.100.20:80", false},
		{"ClusterIP from outside the ranges", "tcp4", "10.2.0.5", "10.96.0.10:80", true},
		{"UDP LB IP from an allowed range", "udp4", "10.1.0.5", "198.51.100.20:53", true},
		{"UDP LB IP from outside the ranges", "udp4", "10.2.0.5", "198.51.100.20:53", false},
		{"UDP ClusterIP from outside the ranges", "udp4", "10.2.0.5", "10.96.0.10:53", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if served := dialServedFrom(runner, tt.network, tt.from, tt.to); served != tt.served {
				t.Errorf("from %s to %s: served=%v, want %v", tt.from, tt.to, served, tt.served)
			}
		})
	}

	// Control: without the chain's rules the refused source gets through,
	// so the drop above is theirs and not a routing accident.
	inNetns(t, ns, "iptables", "-t", "filter", "-F", ChainLBSourceRanges)
	if !dialServedFrom(runner, "tcp4", "10.2.0.5", "198.51.100.20:80") {
		t.Error("without the source-range rules the LB IP was not served from 10.2.0.5")
	}
}

// dialServedFrom is dialServed from a chosen local address.
func dialServedFrom(runner *nsRunner, network, from, to string) bool {
	served := false
	runner.th.do(func() {
		d := net.Dialer{Timeout: 500 * time.Millisecond}
		local := net.JoinHostPort(from, "0")
		var err error
		if network == "udp4" {
			d.LocalAddr, err = net.ResolveUDPAddr(network, local)
		} else {
			d.LocalAddr, err = net.ResolveTCPAddr(network, local)
		}
		if err != nil {
			return
		}
		c, err := d.Dial(network, to)
		if err != nil {
			return
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
