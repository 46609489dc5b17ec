package proxier

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"
)

// Many clients with several datagrams each in flight at once: their
// requests are read udpBatchLen at a time and their replies, from many
// backend sockets, leave in shared sendmmsg batches. Each client must get
// exactly its own replies, whole, from the address it sent to, on an IPv4
// socket, a dual-stack wildcard socket (IPv4 clients written as
// IPv4-mapped addresses, each reply with its own source control message)
// and to IPv6 clients.
func TestUDPBatchesDeliverEveryClientItsOwnReplies(t *testing.T) {
	// servedUDPPort allows 16 sessions.
	const clients, perClient = 14, 6
	echo := startUDPEcho(t, "127.0.0.2:0", "re:")
	backend := echo.LocalAddr().(*net.UDPAddr).AddrPort()
	for _, tc := range []struct {
		name, network, listen, client string
	}{
		{"IPv4 socket", "udp4", "127.0.0.1", "127.0.0.1"},
		{"dual-stack wildcard socket, IPv4 clients", "udp", "::", "127.0.0.1"},
		{"dual-stack wildcard socket, IPv6 clients", "udp", "::", "::1"},
		{"IPv6 socket", "udp6", "::1", "::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock, _ := servedUDPPort(t, tc.network, netip.AddrPortFrom(netip.MustParseAddr(tc.listen), 0), backend)
			service := netip.AddrPortFrom(netip.MustParseAddr(tc.client), uint16(sock.Port()))
			conns := make([]*net.UDPConn, clients)
			for i := range conns {
				c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(service))
				if err != nil {
					t.Skipf("no client socket to %v: %v", service, err)
				}
				defer c.Close()
				conns[i] = c
			}
			// Everything is sent before anything is read.
			for k := range perClient {
				for i, c := range conns {
					msg := fmt.Sprintf("client %d datagram %d %s", i, k, strings.Repeat("x", i*k))
					if _, err := c.Write([]byte(msg)); err != nil {
						t.Fatal(err)
					}
				}
			}
			buf := make([]byte, maxDatagram)
			for i, c := range conns {
				var got []string
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				for range perClient {
					n, from, err := c.ReadFromUDPAddrPort(buf)
					if err != nil {
						t.Fatalf("client %d: %d of %d replies, then %v", i, len(got), perClient, err)
					}
					if from.Addr().Unmap() != service.Addr() || from.Port() != service.Port() {
						t.Fatalf("client %d: a reply from %v, want %v", i, from, service)
					}
					got = append(got, string(buf[:n]))
				}
				sort.Strings(got)
				for k, g := range got {
					if want := fmt.Sprintf("re:client %d datagram %d %s", i, k, strings.Repeat("x", i*k)); g != want {
						t.Fatalf("client %d: reply %q, want %q", i, g, want)
					}
				}
			}
		})
	}
}
