package proxier

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
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

// Runs of replies of one size become one GSO buffer each; a shorter reply
// ends a run, a longer one or an empty one starts a new message.
func TestUDPRepliesGroupIntoGSORuns(t *testing.T) {
	client := netip.MustParseAddrPort("10.0.0.1:53")
	for _, tc := range []struct {
		name  string
		sizes []int
		gso   bool
		want  [][2]int // per message: datagrams, segment size
	}{
		{"one", []int{64}, true, [][2]int{{1, 64}}},
		{"equal", []int{64, 64, 64}, true, [][2]int{{3, 64}}},
		{"shorter last", []int{64, 64, 10}, true, [][2]int{{3, 64}}},
		{"shorter ends a run", []int{64, 10, 64, 64}, true, [][2]int{{2, 64}, {2, 64}}},
		{"longer starts a run", []int{64, 100, 100}, true, [][2]int{{1, 64}, {2, 100}}},
		{"empty alone", []int{64, 0, 0, 64}, true, [][2]int{{1, 64}, {1, 0}, {1, 0}, {1, 64}}},
		{"above a segment's bound", []int{gsoMaxSegment + 1, gsoMaxSegment + 1}, true, [][2]int{{1, gsoMaxSegment + 1}, {1, gsoMaxSegment + 1}}},
		{"at a segment's bound", []int{gsoMaxSegment, gsoMaxSegment}, true, [][2]int{{2, gsoMaxSegment}}},
		{"GSO off", []int{64, 64}, false, [][2]int{{1, 64}, {1, 64}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newUDPBatch()
			copy(b.size[:], tc.sizes)
			if !b.queueReplies(len(tc.sizes), client, nil, unix.AF_INET, tc.gso) {
				t.Fatal("an IPv4 client of an IPv4 socket was not queued")
			}
			var got [][2]int
			for k := range b.queued {
				got = append(got, [2]int{b.count[k], b.size[b.first[k]]})
				total := 0
				for i := b.first[k]; i < b.first[k]+b.count[k]; i++ {
					total += b.size[i]
				}
				iovs := unsafe.Slice(b.msgs[k].Hdr.Iov, b.msgs[k].Hdr.Iovlen)
				sum := 0
				for _, v := range iovs {
					sum += int(v.Len)
				}
				if sum != total {
					t.Errorf("message %d: its iovecs hold %d bytes, its datagrams %d", k, sum, total)
				}
				if hasSegment := b.msgs[k].Hdr.Controllen > 0; hasSegment != (b.count[k] > 1) {
					t.Errorf("message %d of %d datagrams: control message %v", k, b.count[k], hasSegment)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("messages (datagrams, size) %v, want %v", got, tc.want)
			}
			if b.used != len(tc.sizes) {
				t.Fatalf("%d slots used, want %d", b.used, len(tc.sizes))
			}
		})
	}
}

// burstEcho answers every group of n datagrams it receives with their
// echoes, sent together with one sendmmsg, so that the proxy finds several
// replies of one size queued on its backend socket.
func burstEcho(t *testing.T, n int) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		bufs := make([][]byte, n)
		for i := range bufs {
			bufs[i] = make([]byte, 2048)
		}
		msgs := make([]rawio.Mmsghdr, n)
		iovs := make([]unix.Iovec, n)
		var name unix.RawSockaddrInet6
		for {
			var from netip.AddrPort
			for i := range n {
				m, f, err := pc.ReadFromUDPAddrPort(bufs[i])
				if err != nil {
					return
				}
				from = f
				iovs[i].Base = &bufs[i][0]
				iovs[i].SetLen(m)
			}
			namelen, _ := rawio.PutSockaddr(&name, from, unix.AF_INET)
			for i := range msgs {
				msgs[i].Hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&name)), Namelen: namelen, Iov: &iovs[i], Iovlen: 1}
			}
			raw, _ := pc.SyscallConn()
			_ = raw.Write(func(fd uintptr) bool {
				_, _ = rawio.Sendmmsg(int(fd), msgs)
				return true
			})
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// A client's datagrams of one size read together go to its backend as GSO
// buffers, the backend's replies of one size read together come back as
// GSO buffers, and each arrives as the datagram it was.
func TestUDPRunsLeaveAsGSOBuffers(t *testing.T) {
	const n, rounds = 8, 30
	sock, served := servedUDPPort(t, "udp4", netip.MustParseAddrPort("127.0.0.1:0"), burstEcho(t, n))
	sendBursts(t, sock, n, rounds, nil)
	sock.Close()
	<-served
	if sock.noGSO || sock.noGSOUp {
		t.Fatalf("GSO was refused on loopback (to clients: %v, to backends: %v)", sock.noGSO, sock.noGSOUp)
	}
	if sock.gsoSends == 0 || sock.gsoSendsUp == 0 {
		t.Fatalf("%d GSO buffers to the client and %d to the backend in %d rounds of %d datagrams sent together, want some of both",
			sock.gsoSends, sock.gsoSendsUp, rounds, n)
	}
	t.Logf("%d datagrams each way: %d GSO buffers to the backend, %d to the client", n*rounds, sock.gsoSendsUp, sock.gsoSends)
}

// Where the kernel refuses GSO (here: a socket without UDP checksums,
// which GSO needs), the refused buffer's datagrams are sent one by one,
// and the socket sends no GSO buffer again.
func TestUDPRefusedGSOFallsBackToDatagrams(t *testing.T) {
	const n, rounds = 8, 10
	sock, served := servedUDPPort(t, "udp4", netip.MustParseAddrPort("127.0.0.1:0"), burstEcho(t, n))
	raw, err := sock.conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var optErr error
	if err := raw.Control(func(fd uintptr) { optErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1) }); err != nil || optErr != nil {
		t.Fatal(err, optErr)
	}
	sendBursts(t, sock, n, rounds, nil)
	sock.Close()
	<-served
	if !sock.noGSO {
		t.Fatal("GSO is still on after the kernel refused it (or it was never tried)")
	}
	if sock.gsoSends != 0 {
		t.Fatalf("%d GSO buffers counted as sent on a socket that refuses them", sock.gsoSends)
	}
}

// sendBursts sends rounds of n equal-size datagrams (the last shorter)
// through sock with one sendmmsg each, so that they queue together on the
// service socket, and checks every echo comes back whole.
func sendBursts(t *testing.T, sock *udpProxySocket, n, rounds int, between func()) {
	t.Helper()
	c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sock.Port()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	bufs := make([][]byte, n)
	msgs := make([]rawio.Mmsghdr, n)
	iovs := make([]unix.Iovec, n)
	for r := range rounds {
		want := map[string]bool{}
		for i := range n {
			msg := fmt.Sprintf("round %03d datagram %03d %s", r, i, strings.Repeat("z", 300))
			if i == n-1 {
				msg = msg[:40]
			}
			want[msg] = true
			bufs[i] = []byte(msg)
			iovs[i].Base = &bufs[i][0]
			iovs[i].SetLen(len(bufs[i]))
			msgs[i].Hdr = unix.Msghdr{Iov: &iovs[i], Iovlen: 1}
		}
		var sendErr error
		if err := raw.Write(func(fd uintptr) bool {
			_, sendErr = rawio.Sendmmsg(int(fd), msgs)
			return true
		}); err != nil || sendErr != nil {
			t.Fatal(err, sendErr)
		}
		expectEach(t, c, r, want)
		if between != nil {
			between()
		}
	}
}

// Where the kernel refuses GSO on a backend socket, the datagrams go one
// by one, and that port sends no GSO buffer to a backend again. The
// client sends GSO buffers, which the service socket reads whole (UDP
// GRO), so a GSO send to the backend is tried every round: datagrams sent
// one by one could be read one by one on a loaded machine, and then no
// GSO send was ever tried (1 run in 100 failed so).
func TestUDPRefusedGSOToBackendFallsBackToDatagrams(t *testing.T) {
	const n, rounds = 8, 10
	sock, served := servedUDPPort(t, "udp4", netip.MustParseAddrPort("127.0.0.1:0"), burstEcho(t, n))
	// After each round the session's backend socket loses its UDP
	// checksums, which GSO needs.
	noChecksums := func() {
		sock.mu.Lock()
		defer sock.mu.Unlock()
		sock.sessions.each(func(sess *udpSession) {
			if err := unix.SetsockoptInt(sess.fd, unix.SOL_SOCKET, unix.SO_NO_CHECK, 1); err != nil {
				t.Error(err)
			}
		})
	}
	sendGSOBursts(t, sock, n, 300, rounds, noChecksums)
	sock.Close()
	<-served
	if !sock.noGSOUp {
		t.Fatal("GSO to the backend is still on after the kernel refused it (or it was never tried)")
	}
}
