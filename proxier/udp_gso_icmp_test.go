package proxier

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A GSO run whose send meets the session socket's pending error from an
// ICMP error (IP_RECVERR makes it the socket's error; the send takes it
// and sends nothing) is not the kernel refusing GSO: a protocol
// unreachable (ENOPROTOOPT) or a source route failed (EOPNOTSUPP) is
// also an errno gsoRefused names, and was taken for one, turning GSO to
// backends off for the whole service socket for good. The error queue is
// read as writeSessionLocked reads it, and GSO stays on. Needs
// CAP_NET_RAW.
func TestUDPGSORunMeetingAnICMPErrorKeepsGSO(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs CAP_NET_RAW (root) for raw ICMP sockets")
	}
	a := startUDPEcho(t, "127.0.0.1:0", "a:")
	endpoint := a.LocalAddr().(*net.UDPAddr).AddrPort()
	ip := newInflightPort(t, time.Minute, endpoint)
	ip.send("q1")
	sess := ip.session()
	if sess == nil {
		t.Fatal("no session after the first datagram")
	}
	ip.sock.mu.Lock()
	fd, port := sess.fd, sess.port
	ip.sock.mu.Unlock()
	// Destination unreachable, code 2: protocol unreachable (ENOPROTOOPT).
	injectICMP4(t, fd, netip.AddrPortFrom(endpoint.Addr(), port), endpoint, 3, 2)

	b := getUDPBatch()
	defer putUDPBatch(b)
	for i := range 2 {
		b.size[i], b.seg[i] = copy(b.data[i][:], "gs"), 0
	}
	next := ip.sock.forwardGSO(ip.client.LocalAddr().(*net.UDPAddr).AddrPort(), b, 0, 2)
	if ip.sock.noGSOUp {
		t.Fatal("a GSO run that met the pending error of an ICMP protocol unreachable turned GSO to backends off for the socket")
	}
	// The endpoint is unreachable: the session ends, as when the error is
	// read on EPOLLERR, and the run's other datagram goes on one by one.
	if ip.session() != nil || next != 1 {
		t.Fatalf("after a protocol unreachable: session kept %v, forwardGSO returned %d, want the session ended and 1", ip.session() != nil, next)
	}
}

// injectICMP4 sends an ICMP error of typ and code about a datagram from
// session to endpoint, and waits until the session's socket fd holds it.
func injectICMP4(t *testing.T, fd int, session, endpoint netip.AddrPort, typ, code uint8) {
	t.Helper()
	msg := destUnreachable4(code, session, endpoint, 1)
	msg[0], msg[2], msg[3] = typ, 0, 0
	binary.BigEndian.PutUint16(msg[2:], checksum(msg))
	raw, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(raw)
	if err := unix.Sendto(raw, msg, 0, &unix.SockaddrInet4{Addr: session.Addr().As4()}); err != nil {
		t.Fatal(err)
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(5 * time.Second)
	for fds[0].Revents&unix.POLLERR == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the ICMP error did not reach the session's socket within 5 s")
		}
		fds[0].Revents = 0
		if _, err := unix.Poll(fds, 100); err != nil && err != unix.EINTR {
			t.Fatal(err)
		}
	}
}
