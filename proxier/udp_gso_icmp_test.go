package proxier

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A GSO run whose send meets the session socket's pending error from an
// ICMP error (IP_RECVERR makes it the socket's error; the send takes it
// and sends nothing) is not the kernel refusing GSO: a protocol
// unreachable (ENOPROTOOPT) or a source route failed (EOPNOTSUPP) is
// also an errno gsoRefused names, and was taken for one, turning GSO to
// backends off for the whole service socket for good. The error queue is
// read as for a datagram sent alone (sendSessionLocked), and GSO stays on. Needs
// CAP_NET_RAW.
func TestUDPGSORunMeetingAnICMPErrorKeepsGSO(t *testing.T) {
	ip := newICMPSession(t)
	// Destination unreachable, code 2: protocol unreachable (ENOPROTOOPT).
	injectICMP4(t, ip.fd, ip.local, ip.endpoint, 3, 2)

	next := ip.forwardRunOfTwo()
	if ip.sock.noGSOUp {
		t.Fatal("a GSO run that met the pending error of an ICMP protocol unreachable turned GSO to backends off for the socket")
	}
	// The endpoint is unreachable: the session ends, as when the error is
	// read on EPOLLERR, and the run's other datagram goes on one by one.
	if ip.session() != nil || next != 1 {
		t.Fatalf("after a protocol unreachable: session kept %v, forwardGSO returned %d, want the session ended and 1", ip.session() != nil, next)
	}
}

// More ICMP errors about a session's datagrams than one look at its error
// queue reads (errQueueDrain; a flood of forged time exceeded errors, which
// are passed over) leave the socket's error set after the look, and the
// send after it takes that too. A GSO run's send tried once more after one
// look only, and then went one by one (no GSO buffer) where a datagram sent
// alone tries after each of a few looks: one mechanism (sendSessionLocked)
// serves both now, and the run goes as one buffer. Needs CAP_NET_RAW.
func TestUDPGSORunGoesPastMoreICMPErrorsThanOneLookReads(t *testing.T) {
	ip := newICMPSession(t)
	ip.relayWhenQueued(t)
	if got := ip.reply(time.Second); got != "a:q1" {
		t.Fatalf("client got %q, want a:q1", got)
	}
	// Room for every error: each is charged to the receive buffer.
	if err := unix.SetsockoptInt(ip.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20); err != nil {
		t.Fatal(err)
	}
	base := receiveMemory(t, ip.fd)
	injectTimeExceeded(t, ip.fd, ip.local, ip.endpoint)
	one := receiveMemory(t, ip.fd) - base
	const errs = errQueueDrain + 8
	for range errs - 1 {
		injectTimeExceeded(t, ip.fd, ip.local, ip.endpoint)
	}
	for deadline := time.Now().Add(5 * time.Second); receiveMemory(t, ip.fd) < base+errs*one; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d ICMP errors queued on the session's socket within 5 s", (receiveMemory(t, ip.fd)-base)/one, errs)
		}
		time.Sleep(time.Millisecond)
	}

	if next := ip.forwardRunOfTwo(); next != 2 {
		t.Fatalf("forwardGSO returned %d after %d ICMP errors were queued, want 2: the run sent as one GSO buffer past them", next, errs)
	}
	if ip.session() == nil || ip.sock.noGSOUp || ip.sock.gsoSendsUp != 1 {
		t.Fatalf("session kept %v, GSO to backends off %v, GSO sends %d; want the session kept and one GSO send", ip.session() != nil, ip.sock.noGSOUp, ip.sock.gsoSendsUp)
	}
}

// forwardRunOfTwo has forwardGSO send a run of two datagrams from the
// session's client, and returns what it returned (the first slot not sent).
func (ip icmpSession) forwardRunOfTwo() int {
	b := getUDPBatch()
	defer putUDPBatch(b)
	for i := range 2 {
		b.size[i], b.seg[i] = copy(b.data[i][:], "gs"), 0
	}
	return ip.sock.forwardGSO(ip.client.LocalAddr().(*net.UDPAddr).AddrPort(), b, 0, 2)
}

// receiveMemory is the memory charged to socket fd's receive buffer, its
// error queue's too (SO_MEMINFO's rmem_alloc).
func receiveMemory(t *testing.T, fd int) int {
	t.Helper()
	var info [unix.SK_MEMINFO_VARS]uint32
	size := uint32(unsafe.Sizeof(info))
	if _, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&size)), 0); errno != 0 {
		t.Fatalf("SO_MEMINFO: %v", errno)
	}
	return int(info[unix.SK_MEMINFO_RMEM_ALLOC])
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
