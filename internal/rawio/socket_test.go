package rawio

import (
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// PollOut says POLLOUT while a socket has room, nothing once its send
// buffer is full, and POLLHUP once its peer is gone.
func TestPollOut(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	if ev, err := PollOut(fds[0]); err != nil || ev&unix.POLLOUT == 0 {
		t.Fatalf("an empty socket: events %#x, %v; want POLLOUT", ev, err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := unix.Write(fds[0], chunk); err != nil {
			break // EAGAIN: full
		}
	}
	if ev, err := PollOut(fds[0]); err != nil || ev != 0 {
		t.Fatalf("a full socket: events %#x, %v; want none", ev, err)
	}
	unix.Close(fds[1])
	if ev, err := PollOut(fds[0]); err != nil || ev&unix.POLLHUP == 0 {
		t.Fatalf("a socket whose peer closed: events %#x, %v; want POLLHUP", ev, err)
	}
}

// TCPClosed, the waits' callback (faults' delays, relay's dial watch),
// holds through the peer's data and FIN and ends at its reset.
func TestTCPClosedOnlyAtReset(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	closed := func() (yes bool) {
		if err := raw.Control(func(fd uintptr) { yes = TCPClosed(fd) }); err != nil {
			t.Fatal(err)
		}
		return yes
	}
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := peer.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The FIN has arrived once a read sees EOF.
	if b, err := io.ReadAll(c); err != nil || string(b) != "x" {
		t.Fatalf("read %q, %v", b, err)
	}
	if closed() {
		t.Fatal("closed after the peer's data and FIN")
	}
	_ = peer.(*net.TCPConn).SetLinger(0)
	peer.Close() // a reset
	for deadline := time.Now().Add(5 * time.Second); !closed(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not closed after the peer's reset")
		}
	}
}
