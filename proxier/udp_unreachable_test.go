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
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
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
			queryRefused(t, tt.client, net.JoinHostPort(tt.bind, strconv.Itoa(port)))
		})
	}
}

// TestUDPEndpointRefusalReachesTheClient: a client whose endpoint refuses
// its datagrams (nothing listens on the endpoint's port) gets a port
// unreachable too, as the endpoint's own reaches it through kube-proxy's
// DNAT: the proxy's backend socket took the endpoint's error, and the
// client waited out its timeout (review: an i/o timeout on every query).
// Needs CAP_NET_RAW.
func TestUDPEndpointRefusalReachesTheClient(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs CAP_NET_RAW (root) for the raw ICMP socket")
	}
	for _, tt := range []struct{ name, bind, dial, endpoint, client string }{
		{"IPv4", "127.0.0.1", "127.0.0.1", "127.0.0.2", "udp4"},
		{"IPv6", "::1", "::1", "::1", "udp6"},
		// The default bind address: the error's source is where the
		// client's datagram arrived (IP_PKTINFO), not the socket's
		// unspecified address, from which nothing can be sent.
		{"IPv4 wildcard", "0.0.0.0", "127.0.0.1", "127.0.0.2", "udp4"},
		{"IPv6 wildcard", "::", "::1", "::1", "udp6"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			closed, err := net.ListenPacket(tt.client, net.JoinHostPort(tt.endpoint, "0"))
			if err != nil {
				t.Fatal(err)
			}
			endpoint := closed.LocalAddr().String()
			closed.Close() // nothing listens there now
			p := newTestProxier(t, Options{BindAddress: netip.MustParseAddr(tt.bind)})
			svc := makeService("dns", withProtocol(v1.ProtocolUDP))
			slice := makeSlice("dns", v1.ProtocolUDP, endpoint)
			if tt.client == "udp6" {
				// An IPv6 Service: with the IPv4 cluster IP the port
				// had no endpoint of the client's family, and the
				// refusal came from the no-endpoints path.
				withClusterIP("fd00::10")(svc)
				slice.AddressType = discovery.AddressTypeIPv6
			}
			p.OnServiceAdd(svc)
			p.OnEndpointSliceAdd(slice)
			p.Sync()
			port, ok := p.ProxyPort("default/dns:p")
			if !ok {
				t.Fatal("no proxy socket")
			}
			queryRefused(t, tt.client, net.JoinHostPort(tt.dial, strconv.Itoa(port)))
		})
	}
}

// queryRefused sends a datagram to addr from a connected socket and wants
// ECONNREFUSED (a port unreachable) back at once.
func queryRefused(t *testing.T, network, addr string) {
	t.Helper()
	c, err := net.Dial(network, addr)
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
}

// The messages quote the datagram as a receiver matches it: the IP header
// (addresses, protocol UDP, a valid IPv4 checksum) and the UDP ports.
func TestPortUnreachableMessages(t *testing.T) {
	client, local := netip.MustParseAddrPort("10.244.1.5:40000"), netip.MustParseAddrPort("10.0.0.1:31000")
	m := destUnreachable4(3, client, local, 100)
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
	m6 := destUnreachable6(4, netip.MustParseAddrPort("[fd00::5]:40000"), netip.MustParseAddrPort("[fd00::1]:31000"), 10)
	if m6[0] != 1 || m6[1] != 4 || m6[8]>>4 != 6 || m6[8+6] != 17 || len(m6) != 8+40+8 {
		t.Fatalf("ICMPv6 message % x", m6)
	}
}

// The destination comes from the datagram's packet info (a socket on the
// wildcard address), else from the socket's own address, and costs no
// allocation: it runs for every datagram a flood to a port without
// endpoints sends past the rate limit's check.
func TestDatagramDestination(t *testing.T) {
	bound4 := netip.MustParseAddrPort("0.0.0.0:31000")
	oob4 := ipv4.NewControlMessage(ipv4.FlagDst)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob4[0]))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	info := (*unix.Inet4Pktinfo)(unsafe.Pointer(&oob4[unix.CmsgLen(0)]))
	info.Addr = [4]byte{10, 0, 0, 1}
	oob6 := ipv6.NewControlMessage(ipv6.FlagDst)
	h6 := (*unix.Cmsghdr)(unsafe.Pointer(&oob6[0]))
	h6.Level, h6.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
	h6.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
	info6 := (*unix.Inet6Pktinfo)(unsafe.Pointer(&oob6[unix.CmsgLen(0)]))
	info6.Addr = netip.MustParseAddr("fd00::1").As16()
	for _, tt := range []struct {
		name  string
		oob   []byte
		bound netip.AddrPort
		want  string
	}{
		{"IPv4 packet info", oob4, bound4, "10.0.0.1:31000"},
		{"IPv6 packet info", oob6, netip.MustParseAddrPort("[::]:31000"), "[fd00::1]:31000"},
		{"a bound address", nil, netip.MustParseAddrPort("127.0.0.1:31000"), "127.0.0.1:31000"},
		{"the wildcard, no packet info", nil, bound4, "invalid AddrPort"},
	} {
		if got := datagramDestination(tt.oob, tt.bound).String(); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { datagramDestination(oob4, bound4) }); n != 0 {
		t.Errorf("%v allocations per destination", n)
	}
}

// The IPv4 raw socket receives nothing (ICMP_FILTER blocks every type):
// without the filter the kernel queues it a copy of each ICMP message the
// node receives. A closed sender opens no socket again: a port's Serve may
// still forward a datagram after the proxier stopped.
func TestUnreachableSocketFilteredAndClosed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs CAP_NET_RAW (root) for the raw ICMP socket")
	}
	u := newUnreachableSender()
	u.mu.Lock()
	fd := u.socketLocked(0)
	u.mu.Unlock()
	if fd < 0 {
		t.Fatal("no raw socket")
	}
	if v, err := unix.GetsockoptInt(fd, unix.SOL_RAW, icmpFilter); err != nil || uint32(v) != 0xffffffff {
		t.Fatalf("ICMP_FILTER %#x, %v; want every type blocked", uint32(v), err)
	}
	u.close()
	u.send(netip.MustParseAddrPort("127.0.0.1:40000"), nil, netip.MustParseAddrPort("127.0.0.1:31000"), []byte("x"))
	if u.fd != [2]int{-1, -1} {
		t.Fatalf("a send after close opened %v", u.fd)
	}
}

// A flood to a port without endpoints draws no more errors than the
// sender's limiter grants, not one per datagram: the node is no
// reflector. The limiter here grants its burst and never refills, so the
// count does not depend on how fast the flood went; the client queues every
// ICMP error it gets (IP_RECVERR) and counts them.
func TestUnreachableRateLimited(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs CAP_NET_RAW (root) for the raw ICMP socket")
	}
	p := newTestProxier(t, Options{})
	p.sockCfg.unreachable.limit = rate.NewLimiter(0, unreachableBurst)
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.Sync()
	c, err := net.Dial("udp4", proxyAddr(t, p, "default/dns:p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, _ := c.(*net.UDPConn).SyscallConn()
	_ = raw.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVERR, 1) })
	const flood = 10 * unreachableBurst
	for range flood {
		_, _ = c.Write([]byte("q")) // a queued error fails a write now and then
	}
	time.Sleep(200 * time.Millisecond) // what the proxy read, it has answered
	errs := 0
	buf, oob := make([]byte, 512), make([]byte, 512)
	_ = raw.Control(func(fd uintptr) {
		for {
			if _, _, _, _, err := unix.Recvmsg(int(fd), buf, oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT); err != nil {
				return
			}
			errs++
		}
	})
	if errs == 0 || errs > unreachableBurst {
		t.Fatalf("%d ICMP errors for %d datagrams, want 1 to %d", errs, flood, unreachableBurst)
	}
}

// An error to an IPv6 link-local client (a peer on the node's link sending
// to a NodePort on the node's link-local address) names the client's link,
// the zone its datagram came in with: without it the kernel routed the
// error by the first fe80::/64 route, and a client on any other link never
// got it (a node with two links: the error left by the first, its
// neighbour solicitation unanswered there).
func TestUnreachableToALinkLocalClientNamesItsLink(t *testing.T) {
	for _, tc := range []struct {
		client string
		zone   uint32
	}{
		{"fe80::1%7", 7},
		{"fd00::1", 0},
		{"10.0.0.1", 0},
	} {
		sa := icmpDestination(netip.MustParseAddr(tc.client))
		switch sa := sa.(type) {
		case *unix.SockaddrInet6:
			if sa.ZoneId != tc.zone || netip.AddrFrom16(sa.Addr) != netip.MustParseAddr(tc.client).WithZone("") {
				t.Errorf("error to %s sent to %v zone %d, want zone %d", tc.client, netip.AddrFrom16(sa.Addr), sa.ZoneId, tc.zone)
			}
		case *unix.SockaddrInet4:
			if netip.AddrFrom4(sa.Addr) != netip.MustParseAddr(tc.client) {
				t.Errorf("error to %s sent to %v", tc.client, netip.AddrFrom4(sa.Addr))
			}
		}
	}
}
