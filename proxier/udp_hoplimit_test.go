package proxier

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// ttlBackend is a UDP backend that reports each datagram's TTL (hop limit).
type ttlBackend struct {
	conn *net.UDPConn
	v4   *ipv4.PacketConn
	v6   *ipv6.PacketConn
}

func startTTLBackend(t *testing.T, addr string) *ttlBackend {
	t.Helper()
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	b := &ttlBackend{conn: conn}
	if netip.MustParseAddrPort(addr).Addr().Is4() {
		b.v4 = ipv4.NewPacketConn(conn)
		err = b.v4.SetControlMessage(ipv4.FlagTTL, true)
	} else {
		b.v6 = ipv6.NewPacketConn(conn)
		err = b.v6.SetControlMessage(ipv6.FlagHopLimit, true)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *ttlBackend) addr() netip.AddrPort { return b.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// next returns the next datagram and its TTL, ok false when none came
// within wait.
func (b *ttlBackend) next(t *testing.T, wait time.Duration) (payload string, ttl int, ok bool) {
	t.Helper()
	_ = b.conn.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 1500)
	if b.v4 != nil {
		n, cm, _, err := b.v4.ReadFrom(buf)
		if err != nil {
			return "", 0, false
		}
		return string(buf[:n]), cm.TTL, true
	}
	n, cm, _, err := b.v6.ReadFrom(buf)
	if err != nil {
		return "", 0, false
	}
	return string(buf[:n]), cm.HopLimit, true
}

// A session's backend datagrams leave with the TTL (hop limit) of the
// client datagram that opened it, less one, as a router forwards it: a
// loop through another node's proxy ends (test/e2e
// TestUDPLoopThroughAnotherNodeEnds). One that arrives with one hop left
// is dropped, counted as failed. Before, every backend datagram left at
// the node's default TTL (64), whatever the client's had left.
func TestUDPSessionSendsOneHopLessThanItsClient(t *testing.T) {
	for _, tc := range []struct {
		name, network, listen, backend, client string
	}{
		{"IPv4 socket", "udp4", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1"},
		{"dual-stack wildcard socket, IPv4 client", "udp", "[::]:0", "127.0.0.1:0", "127.0.0.1"},
		{"dual-stack wildcard socket, IPv6 client", "udp", "[::]:0", "[::1]:0", "::1"},
		{"IPv6 socket", "udp6", "[::1]:0", "[::1]:0", "::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			backend := startTTLBackend(t, tc.backend)
			conn, err := net.ListenUDP(tc.network, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(tc.listen)))
			if err != nil {
				t.Fatal(err)
			}
			sock := startUDPSocket(t, conn, backend.addr())
			to := netip.AddrPortFrom(netip.MustParseAddr(tc.client), uint16(sock.Port()))
			for _, c := range []struct {
				ttl     int // the client's
				wantTTL int // at the backend; 0: dropped
			}{
				{64, 63}, // a pod's or the node's own: one less, as after kube-proxy's forwarding
				{10, 9},  // the ninth hop of a loop
				{1, 0},   // the last: dropped, as a router drops it
				{255, 254},
			} {
				client, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(to.Addr(), 0)))
				if err != nil {
					t.Fatal(err)
				}
				defer client.Close()
				if to.Addr().Is4() {
					err = ipv4.NewConn(client).SetTTL(c.ttl)
				} else {
					err = ipv6.NewConn(client).SetHopLimit(c.ttl)
				}
				if err != nil {
					t.Fatal(err)
				}
				failed := sock.failed.value()
				if _, err := client.WriteToUDPAddrPort([]byte("hop"), to); err != nil {
					t.Fatal(err)
				}
				if c.wantTTL == 0 {
					for deadline := time.Now().Add(5 * time.Second); sock.failed.value() == failed; time.Sleep(5 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("a datagram with TTL 1 was not counted as failed")
						}
					}
					if _, ttl, ok := backend.next(t, 100*time.Millisecond); ok {
						t.Fatalf("a datagram with TTL 1 reached the backend (TTL %d), want it dropped", ttl)
					}
					continue
				}
				_, ttl, ok := backend.next(t, 5*time.Second)
				if !ok {
					t.Fatalf("a datagram with TTL %d did not reach the backend", c.ttl)
				}
				if ttl != c.wantTTL {
					t.Errorf("a client datagram with TTL %d reached the backend with TTL %d, want %d", c.ttl, ttl, c.wantTTL)
				}
			}
		})
	}
}
