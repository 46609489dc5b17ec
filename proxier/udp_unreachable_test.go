package proxier

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// TestUDPNoEndpointsRefused: a datagram to a UDP service port without
// endpoints is answered with ICMP port unreachable, as kube-proxy's REJECT
// answers it, so a connected client gets ECONNREFUSED at once; it was
// dropped and a DNS client waited out its timeouts. Needs CAP_NET_RAW.
func TestUDPNoEndpointsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs CAP_NET_RAW (root) for the raw ICMP socket")
	}
	for _, tt := range []struct{ name, bind, client string }{
		{"IPv4", "127.0.0.1", "udp4"},
		{"IPv6", "::1", "udp6"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestProxier(t, Options{BindAddress: netip.MustParseAddr(tt.bind)})
			p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
			p.Sync()
			port, ok := p.ProxyPort("default/dns:p")
			if !ok {
				t.Fatal("no proxy socket")
			}
			c, err := net.Dial(tt.client, net.JoinHostPort(tt.bind, strconv.Itoa(port)))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			if _, err := c.Write([]byte("query")); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 64))
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("read: %v after %v, want ECONNREFUSED at once", err, time.Since(start))
			}
		})
	}
}

// The messages quote the datagram as a receiver matches it: the IP header
// (addresses, protocol UDP, a valid IPv4 checksum) and the UDP ports.
func TestPortUnreachableMessages(t *testing.T) {
	client, local := netip.MustParseAddrPort("10.244.1.5:40000"), netip.MustParseAddrPort("10.0.0.1:31000")
	m := portUnreachable4(client, local, 100)
	if m[0] != 3 || m[1] != 3 || checksum(m) != 0 {
		t.Fatalf("ICMP type %d code %d, checksum over the message %#x (want 3, 3, 0)", m[0], m[1], checksum(m))
	}
	ip := m[8:28]
	if ip[9] != 17 || checksum(ip) != 0 || netip.AddrFrom4([4]byte(ip[12:16])) != client.Addr() || netip.AddrFrom4([4]byte(ip[16:20])) != local.Addr() {
		t.Fatalf("quoted IPv4 header % x", ip)
	}
	if udp := m[28:36]; binary.BigEndian.Uint16(udp[0:]) != 40000 || binary.BigEndian.Uint16(udp[2:]) != 31000 || binary.BigEndian.Uint16(udp[4:]) != 108 {
		t.Fatalf("quoted UDP header % x", udp)
	}
	m6 := portUnreachable6(netip.MustParseAddrPort("[fd00::5]:40000"), netip.MustParseAddrPort("[fd00::1]:31000"), 10)
	if m6[0] != 1 || m6[1] != 4 || m6[8]>>4 != 6 || m6[8+6] != 17 || len(m6) != 8+40+8 {
		t.Fatalf("ICMPv6 message % x", m6)
	}
}

// The errors are rate limited, as the kernel limits its own ICMP: a flood
// to a Service without endpoints does not make the node a reflector.
func TestUnreachableRateLimited(t *testing.T) {
	u := newUnreachableSender()
	defer u.close()
	allowed := 0
	for range 10 * unreachableBurst {
		if u.limit.Allow() {
			allowed++
		}
	}
	if allowed > unreachableBurst+5 {
		t.Fatalf("%d errors allowed at once, want about %d", allowed, unreachableBurst)
	}
}
