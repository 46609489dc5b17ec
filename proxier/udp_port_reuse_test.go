package proxier

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// A backend's reply that comes after its session ended goes to the port
// the session's socket had. The kernel gives a closed UDP port out again
// at once, at random, so a new session — any client — to the same
// backend could get it, and the late reply reached that other client
// (17 of 4,000 answers 300 ms late, with the kernel's whole ephemeral
// range). A session's socket never takes a port a session closed within
// the quarantine: the late reply reaches nobody, as after its session's
// end. The test's dial lands the new session on the closed session's port,
// as the kernel's random choice may.
func TestUDPLateReplyNeverReachesTheNextSessionOfItsPort(t *testing.T) {
	quarantineFull.Store(0) // an earlier test's churn may have filled the quarantine
	be, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	sock, _ := servedUDPPort(t, "udp4", netip.MustParseAddrPort("127.0.0.1:0"), be.LocalAddr().(*net.UDPAddr).AddrPort())
	service := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sock.Port()}
	// received reads one datagram at the backend: where it came from.
	received := func(want string) netip.AddrPort {
		t.Helper()
		buf := make([]byte, 64)
		_ = be.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := be.ReadFromUDPAddrPort(buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("backend read %q, %v; want %q", buf[:n], err, want)
		}
		return from
	}

	a, err := net.DialUDP("udp4", nil, service)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Write([]byte("question of a")); err != nil {
		t.Fatal(err)
	}
	portOfA := received("question of a")
	// A's session ends (idle, evicted: the same close) before its answer.
	sock.mu.Lock()
	for c := range sock.sessions.byClient {
		sock.closeSessionLocked(sock.sessions.get(c))
	}
	sock.mu.Unlock()

	// B's session's first socket is given A's port. (Set under the
	// socket's mutex, which the serving goroutine opens sessions under.)
	dials := 0
	sock.mu.Lock()
	openUDPBackend = func(ep netip.AddrPort) (int, error) {
		dials++
		if dials > 1 {
			return dialUDPBackend(ep)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(portOfA.Port())}); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(ep.Port()), Addr: ep.Addr().As4()}); err != nil {
			unix.Close(fd)
			return -1, err
		}
		return fd, nil
	}
	sock.mu.Unlock()
	defer func() {
		sock.mu.Lock()
		openUDPBackend = dialUDPBackend
		sock.mu.Unlock()
	}()
	b, err := net.DialUDP("udp4", nil, service)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Write([]byte("question of b")); err != nil {
		t.Fatal(err)
	}
	portOfB := received("question of b")
	if portOfB == portOfA {
		t.Errorf("B's session took the port A's session closed a moment ago (%v)", portOfA)
	}
	// A's late answer, then B's own.
	if _, err := be.WriteToUDPAddrPort([]byte("answer for a"), portOfA); err != nil {
		t.Fatal(err)
	}
	if _, err := be.WriteToUDPAddrPort([]byte("answer for b"), portOfB); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := b.Read(buf)
	if err != nil || string(buf[:n]) != "answer for b" {
		t.Fatalf("client B read %q, %v; want only its own answer", buf[:n], err)
	}
	// The socket put aside on A's port was closed: the port is free.
	if portOfB != portOfA {
		probe, err := net.ListenUDP("udp4", &net.UDPAddr{Port: int(portOfA.Port())})
		if err != nil {
			t.Fatalf("A's port is still held after B's session opened: %v", err)
		}
		probe.Close()
	}
}

// Where every try lands on a quarantined port (sessions opened faster
// than the ephemeral ports can stay quarantined), the last try is taken,
// the others are closed, and for quarantineRest no port is checked: the
// tries could not find one and only cost.
func TestUDPQuarantineFullTakesThePortGiven(t *testing.T) {
	quarantineFull.Store(0)
	defer quarantineFull.Store(0)
	var opened []int
	inode := map[int]uint64{}
	openUDPBackend = func(ep netip.AddrPort) (int, error) {
		fd, err := dialUDPBackend(ep)
		if err == nil {
			local, _ := rawio.LocalAddr(fd)
			quarantinePort(local.Port()) // every port given is one just closed
			opened = append(opened, fd)
			var st unix.Stat_t
			_ = unix.Fstat(fd, &st)
			inode[fd] = st.Ino
		}
		return fd, err
	}
	defer func() { openUDPBackend = dialUDPBackend }()
	ep := netip.MustParseAddrPort("127.0.0.2:9")
	fd, port, err := openFreshUDPBackend(ep, mono.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if len(opened) != quarantineTries || fd != opened[len(opened)-1] {
		t.Fatalf("%d sockets opened, got %d of %v; want %d tries and the last", len(opened), fd, opened, quarantineTries)
	}
	if local, _ := rawio.LocalAddr(fd); local.Port() != port {
		t.Fatalf("port %d reported, the socket's is %d", port, local.Port())
	}
	for _, other := range opened[:len(opened)-1] {
		// Closed, or its number taken by another descriptor since.
		var st unix.Stat_t
		if unix.Fstat(other, &st) == nil && st.Ino == inode[other] {
			t.Errorf("socket %d put aside is still open", other)
		}
	}
	opened = nil
	fd2, _, err := openFreshUDPBackend(ep, mono.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd2)
	if len(opened) != 1 {
		t.Fatalf("%d sockets opened while the quarantine is full, want 1", len(opened))
	}
}
