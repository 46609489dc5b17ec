package proxier

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// An ICMP "packet too big" (IPv6) or "fragmentation needed" (IPv4) for a
// session's flow to its backend is no failure: the kernel notes the path
// MTU and fragments the next datagrams. On a connected socket it also sets
// the socket error EMSGSIZE, which the next read returned: the session was
// closed as broken (its client's next datagram opened another, on another
// endpoint without affinity, and the replies already on their way to the
// old socket were lost), as a router's first Packet Too Big on a path
// narrower than the node's link (a tunnel, a 1280-byte link) did.
func TestUDPSessionSurvivesPacketTooBig(t *testing.T) {
	backend, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	t.Cleanup(func() { backend.Close() })
	// A raw ICMPv6 socket (root) forges the router's error.
	raw, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)
	if err != nil {
		t.Skipf("no raw ICMPv6 socket (needs CAP_NET_RAW): %v", err)
	}
	defer unix.Close(raw)
	peers := make(chan netip.AddrPort, 16)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := backend.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			peers <- from
			_, _ = backend.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	conn, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Fatal(err)
	}
	sock := startUDPSocket(t, conn, backend.LocalAddr().(*net.UDPAddr).AddrPort())
	client, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: net.IPv6loopback, Port: sock.Port()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ask := func(msg string) netip.AddrPort {
		t.Helper()
		if _, err := client.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		_ = client.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 64)
		if n, err := client.Read(buf); err != nil || string(buf[:n]) != msg {
			t.Fatalf("%q: reply %q, %v", msg, buf[:n], err)
		}
		return <-peers
	}
	session := ask("a")

	// Packet Too Big for session → backend, with the largest MTU there is
	// (no smaller than any loopback's): the kernel changes no route for it
	// (this test runs in the host's namespace), yet sets the session
	// socket's error.
	be := backend.LocalAddr().(*net.UDPAddr).AddrPort()
	injectPacketTooBig(t, raw, session, be)
	time.Sleep(200 * time.Millisecond) // the proxy's poller sees the error

	if got := ask("b"); got != session {
		t.Errorf("after a Packet Too Big the client's datagram came from %v, want its session's socket %v: the session was closed as broken", got, session)
	}
	// And a write that meets the error (if the relay loop has not read
	// it: TestUDPSendMeetingPacketTooBigIsMadeAgain places it there).
	injectPacketTooBig(t, raw, session, be)
	if got := ask("c"); got != session {
		t.Errorf("after a second Packet Too Big the client's datagram came from %v, want %v", got, session)
	}
}

// injectPacketTooBig sends the raw ICMPv6 socket's forged Packet Too Big
// for a datagram from session to be on IPv6 loopback, with the largest MTU
// there is (2^32-1), so that no route's MTU changes.
func injectPacketTooBig(t *testing.T, raw int, session, be netip.AddrPort) {
	t.Helper()
	inner := make([]byte, 40+8)
	binary.BigEndian.PutUint32(inner[0:], 6<<28)
	binary.BigEndian.PutUint16(inner[4:], 8)
	inner[6], inner[7] = unix.IPPROTO_UDP, 64
	src, dst := session.Addr().As16(), be.Addr().As16()
	copy(inner[8:], src[:])
	copy(inner[24:], dst[:])
	binary.BigEndian.PutUint16(inner[40:], session.Port())
	binary.BigEndian.PutUint16(inner[42:], be.Port())
	binary.BigEndian.PutUint16(inner[44:], 8)
	ptb := append([]byte{2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, inner...) // type 2, MTU 2^32-1; the kernel sums it
	if err := unix.Sendto(raw, ptb, 0, &unix.SockaddrInet6{Addr: [16]byte{15: 1}}); err != nil {
		t.Fatal(err)
	}
}

// ptbSession is a UDP service port whose relay loop the test drives
// (inflightPort), with one session to an IPv6 loopback backend that does
// not answer, and a raw ICMPv6 socket to forge the path's errors.
type ptbSession struct {
	*inflightPort
	backend *net.UDPConn
	be      netip.AddrPort
	raw     int
	sess    *udpSession
	local   netip.AddrPort // the session socket's address
}

func newPTBSession(t *testing.T) *ptbSession {
	t.Helper()
	backend, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	t.Cleanup(func() { backend.Close() })
	raw, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	if err != nil {
		t.Skipf("no raw ICMPv6 socket (needs CAP_NET_RAW): %v", err)
	}
	t.Cleanup(func() { unix.Close(raw) })
	ps := &ptbSession{backend: backend, be: backend.LocalAddr().(*net.UDPAddr).AddrPort(), raw: raw}
	ps.inflightPort = newInflightPort(t, time.Minute, ps.be)
	ps.send("a")
	ps.local = readFrom(t, backend, "a")
	if ps.sess = ps.session(); ps.sess == nil {
		t.Fatal("no session after the first datagram")
	}
	return ps
}

// packetTooBig forges a Packet Too Big for the session's flow and waits
// until its socket is in error.
func (ps *ptbSession) packetTooBig(t *testing.T) {
	t.Helper()
	injectPacketTooBig(t, ps.raw, ps.local, ps.be)
	fds := []unix.PollFd{{Fd: int32(ps.sess.fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 3000); n != 1 || err != nil || fds[0].Revents&unix.POLLERR == 0 {
		t.Fatalf("the session's socket is not in error after a Packet Too Big (poll %d, %v, revents %#x)", n, err, fds[0].Revents)
	}
}

// An ICMP error the proxy passes over (a Packet Too Big: the kernel keeps
// the path MTU) is read off the session socket's error queue. Left there,
// the socket stays in error and the level-triggered poller reports it at
// every wait: the port's relay loop would spin for the session's life
// (relayFrom's receive takes the socket's error once, not the queue).
func TestUDPPassedOverICMPErrorIsDrained(t *testing.T) {
	ps := newPTBSession(t)
	ps.packetTooBig(t)
	ps.relay()
	if n := ps.sock.poller.ready(); n != 0 {
		t.Fatalf("after a Packet Too Big and one relay turn %d socket(s) still ready: the loop would spin", n)
	}
	if ps.session() != ps.sess {
		t.Fatal("the session was closed by a Packet Too Big")
	}
}

// A client datagram whose send meets the socket's pending EMSGSIZE (a
// Packet Too Big the relay loop has not read yet: the send took the error
// and sent nothing) is sent again, alone and as a GSO run. Without the
// second send the datagram was lost, and a GSO run's EMSGSIZE, taken as
// the kernel refusing GSO, turned GSO to backends off for the socket.
func TestUDPSendMeetingPacketTooBigIsMadeAgain(t *testing.T) {
	t.Run("datagram", func(t *testing.T) {
		ps := newPTBSession(t)
		ps.packetTooBig(t)
		ps.send("b")
		readFrom(t, ps.backend, "b")
	})
	t.Run("GSO run", func(t *testing.T) {
		ps := newPTBSession(t)
		ps.packetTooBig(t)
		b := getUDPBatch()
		defer putUDPBatch(b)
		for i := range 2 {
			b.size[i], b.seg[i] = copy(b.data[i][:], "gs"), 0
		}
		client := ps.client.LocalAddr().(*net.UDPAddr).AddrPort()
		if next := ps.sock.forwardGSO(client, b, 0, 2); next != 2 || ps.sock.noGSOUp {
			t.Fatalf("forwardGSO sent up to slot %d of 2, GSO to backends off: %v", next, ps.sock.noGSOUp)
		}
		readFrom(t, ps.backend, "gs")
		readFrom(t, ps.backend, "gs")
	})
}
