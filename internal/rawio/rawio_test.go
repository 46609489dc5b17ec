package rawio

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func nonblockingPipe(t *testing.T) (r, w int) {
	t.Helper()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

func socketPair(t *testing.T, typ int) (a, b int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

func TestReadWrite(t *testing.T) {
	r, w := nonblockingPipe(t)
	buf := make([]byte, 16)
	if _, err := Read(r, buf); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("read of an empty non-blocking pipe: %v, want EAGAIN", err)
	}
	if n, err := Write(w, nil); n != 0 || err != nil {
		t.Fatalf("empty write: %d, %v", n, err)
	}
	if n, err := Write(w, []byte("hello")); n != 5 || err != nil {
		t.Fatalf("write: %d, %v", n, err)
	}
	if n, err := Read(r, buf); n != 5 || err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read: %d %q, %v", n, buf[:n], err)
	}
	if n, err := Read(r, nil); n != 0 || err != nil {
		t.Fatalf("empty read: %d, %v", n, err)
	}
	if _, err := Write(-1, []byte("x")); !errors.Is(err, unix.EBADF) {
		t.Fatalf("write to -1: %v, want EBADF", err)
	}
}

// An empty write or send on a datagram socket sends an empty datagram (a
// shortcut that skipped the system call dropped UDP keep-alives).
func TestEmptyDatagram(t *testing.T) {
	a, b := socketPair(t, unix.SOCK_DGRAM)
	buf := make([]byte, 8)
	for _, send := range []func(int, []byte) (int, error){Write, Send} {
		if n, err := send(a, nil); n != 0 || err != nil {
			t.Fatalf("empty datagram: %d, %v", n, err)
		}
		if n, err := Read(b, buf); n != 0 || err != nil {
			t.Fatalf("reading the empty datagram: %d, %v; want 0, nil", n, err)
		}
		if _, err := Read(b, buf); !errors.Is(err, unix.EAGAIN) {
			t.Fatalf("after the empty datagram: %v, want EAGAIN (exactly one came)", err)
		}
	}
}

// TestSendNeverBlocksNorRaisesSIGPIPE: Send on a blocking socket says
// EAGAIN when it is full, and to a closed peer it fails with EPIPE without
// a SIGPIPE (write(2) raises one, which the runtime would catch).
func TestSendNeverBlocksNorRaisesSIGPIPE(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := fds[0], fds[1]
	// b is closed below, mid-test: the clean-up closes it only if the test
	// ended first. Closed twice, its number, free in between, could be
	// another descriptor's by then: signal.Notify and the timers below
	// start the runtime's poller, whose epoll descriptor took it, and the
	// next test died in epoll_wait (EINVAL) once the second close had
	// freed it for a socket.
	bOpen := true
	t.Cleanup(func() {
		unix.Close(a)
		if bOpen {
			unix.Close(b)
		}
	})
	if n, err := Send(a, nil); n != 0 || err != nil {
		t.Fatalf("empty send: %d, %v", n, err)
	}
	if n, err := Send(a, []byte("hello")); n != 5 || err != nil {
		t.Fatalf("send: %d, %v", n, err)
	}
	buf := make([]byte, 16)
	if n, err := Read(b, buf); n != 5 || err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read: %d %q, %v", n, buf[:n], err)
	}
	chunk := make([]byte, 64<<10)
	for i := 0; ; i++ {
		_, err := Send(a, chunk)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil || i > 1000 {
			t.Fatalf("filling a blocking socket: %v after %d sends, want EAGAIN", err, i)
		}
	}

	// SIGPIPE goes to the writing thread: keep to one thread, and unblock
	// it there in case the test's parent started us with it blocked.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var pipe, old unix.Sigset_t
	pipe.Val[0] = 1 << (uint(unix.SIGPIPE) - 1)
	if err := unix.PthreadSigmask(unix.SIG_UNBLOCK, &pipe, &old); err != nil {
		t.Fatal(err)
	}
	defer unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	sigpipe := make(chan os.Signal, 2)
	signal.Notify(sigpipe, syscall.SIGPIPE)
	defer signal.Stop(sigpipe)
	unix.Close(b)
	bOpen = false
	if _, err := Send(a, []byte("x")); !errors.Is(err, unix.EPIPE) {
		t.Fatalf("send to a closed peer: %v, want EPIPE", err)
	}
	// The check can fail: write(2) to the same socket raises one. So
	// exactly one SIGPIPE must arrive, however late Send's would have.
	if _, err := Write(a, []byte("x")); !errors.Is(err, unix.EPIPE) {
		t.Fatalf("write to a closed peer: %v, want EPIPE", err)
	}
	select {
	case <-sigpipe:
	case <-time.After(time.Second):
		t.Fatal("write(2) to a closed peer raised no SIGPIPE: the check proves nothing")
	}
	select {
	case <-sigpipe:
		t.Fatal("two SIGPIPEs for one Send and one write(2): Send raised one")
	case <-time.After(100 * time.Millisecond):
	}
}

func TestSpliceThroughPipe(t *testing.T) {
	a, b := socketPair(t, unix.SOCK_STREAM)
	pr, pw := nonblockingPipe(t)
	c, d := socketPair(t, unix.SOCK_STREAM)
	if _, err := Splice(b, pw, 1<<16); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("splice from an empty socket: %v, want EAGAIN", err)
	}
	if _, err := unix.Write(a, []byte("spliced")); err != nil {
		t.Fatal(err)
	}
	if n, err := Splice(b, pw, 1<<16); n != 7 || err != nil {
		t.Fatalf("socket to pipe: %d, %v", n, err)
	}
	if n, err := Splice(pr, c, 7); n != 7 || err != nil {
		t.Fatalf("pipe to socket: %d, %v", n, err)
	}
	buf := make([]byte, 16)
	if n, err := unix.Read(d, buf); string(buf[:n]) != "spliced" || err != nil {
		t.Fatalf("read at the far end: %q, %v", buf[:n], err)
	}
}

func TestShutdownWriteSendsEOF(t *testing.T) {
	a, b := socketPair(t, unix.SOCK_STREAM)
	if err := ShutdownWrite(a); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if n, err := unix.Read(b, buf); n != 0 || err != nil {
		t.Fatalf("peer read after shutdown: %d, %v; want EOF (0, nil)", n, err)
	}
	// The other direction still works: only writing was shut.
	if _, err := unix.Write(b, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if n, err := Read(a, buf); string(buf[:n]) != "ok" || err != nil {
		t.Fatalf("read the open direction: %q, %v", buf[:n], err)
	}
	if err := ShutdownWrite(-1); !errors.Is(err, unix.EBADF) {
		t.Fatalf("shutdown of -1: %v, want EBADF", err)
	}
}

// tcpPair returns a connected loopback TCP pair as raw non-blocking
// descriptors: the accepted end first.
func tcpPair(t *testing.T, inq bool) (accepted, dialled int) {
	t.Helper()
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	if inq {
		// Set on the listener: the accepted socket inherits it.
		if err := unix.SetsockoptInt(ln, unix.SOL_TCP, unix.TCP_INQ, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 1); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(ln)
	if err != nil {
		t.Fatal(err)
	}
	d, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(d) })
	if err := unix.Connect(d, sa); err != nil {
		t.Fatal(err)
	}
	a, _, err := unix.Accept4(ln, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(a) })
	return a, d
}

// recvWhenQueued retries RecvInq until the loopback delivered something.
func recvWhenQueued(t *testing.T, fd int, p []byte) (int, int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		n, inq, err := RecvInq(fd, p)
		if errors.Is(err, unix.EAGAIN) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return n, inq
	}
}

func TestRecvInq(t *testing.T) {
	a, d := tcpPair(t, true)
	if v, err := unix.GetsockoptInt(a, unix.SOL_TCP, unix.TCP_INQ); err != nil || v != 1 {
		t.Fatalf("accepted socket's TCP_INQ = %d, %v; want 1, inherited from the listener", v, err)
	}
	buf := make([]byte, 2)
	if _, inq, err := RecvInq(a, buf); !errors.Is(err, unix.EAGAIN) || inq != -1 {
		t.Fatalf("empty socket: inq %d, %v; want EAGAIN", inq, err)
	}
	if _, err := unix.Write(d, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // all three bytes queued
	if n, inq := recvWhenQueued(t, a, buf); n != 2 || inq != 1 {
		t.Fatalf("2 of 3 bytes: read %d, hint %d; want 2, 1 byte left", n, inq)
	}
	if n, inq := recvWhenQueued(t, a, buf); n != 1 || inq != 0 {
		t.Fatalf("last byte: read %d, hint %d; want 1, 0 (empty, open)", n, inq)
	}
	// Data and FIN queued together: the read that takes the data must
	// say the stream is not over yet, or a reader that trusts the hint
	// would wait for an event that never comes.
	if _, err := unix.Write(d, []byte("z")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Shutdown(d, unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if n, inq := recvWhenQueued(t, a, buf); n != 1 || inq != 1 {
		t.Fatalf("data then FIN: read %d, hint %d; want 1, 1 (EOF to read)", n, inq)
	}
	if n, _ := recvWhenQueued(t, a, buf); n != 0 {
		t.Fatalf("after the FIN: read %d, want 0 (EOF)", n)
	}
}

// At an urgent byte's mark splice moves nothing and says EAGAIN with
// bytes queued; AtMark tells that from an empty socket, and a read steps
// over the mark (the byte, not inline, is skipped).
func TestAtMark(t *testing.T) {
	a, d := tcpPair(t, true)
	_, pw := nonblockingPipe(t)
	if AtMark(a) {
		t.Fatal("empty socket: at the mark")
	}
	if _, err := unix.Write(d, []byte("ab")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendto(d, []byte("!"), unix.MSG_OOB, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(d, []byte("cd")); err != nil {
		t.Fatal(err)
	}
	// Loopback may deliver late on a loaded machine (softirq deferred to
	// ksoftirqd): each step waits, bounded, for what it needs.
	deadline := time.Now().Add(5 * time.Second)
	for moved := int64(0); moved < 2; {
		n, err := Splice(a, pw, 64)
		if err != nil && !errors.Is(err, unix.EAGAIN) || time.Now().After(deadline) {
			t.Fatalf("splice before the mark: %d of 2 bytes, %v", moved, err)
		}
		if errors.Is(err, unix.EAGAIN) {
			time.Sleep(time.Millisecond)
		}
		moved += max(n, 0)
		if moved > 2 {
			t.Fatalf("splice moved %d bytes, past the mark", moved)
		}
	}
	for !AtMark(a) {
		if time.Now().After(deadline) {
			t.Fatal("AtMark after splice stopped at the mark: false")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := Splice(a, pw, 64); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("splice at the mark: %v, want EAGAIN", err)
	}
	buf := make([]byte, 8)
	got := ""
	for len(got) < 2 {
		n, _, err := RecvInq(a, buf)
		if err != nil && !errors.Is(err, unix.EAGAIN) || time.Now().After(deadline) {
			t.Fatalf("read at the mark: %q, %v; want \"cd\"", got, err)
		}
		if errors.Is(err, unix.EAGAIN) {
			time.Sleep(time.Millisecond)
		}
		got += string(buf[:max(n, 0)])
	}
	if got != "cd" {
		t.Fatalf("read at the mark: %q, want \"cd\"", got)
	}
	if AtMark(a) {
		t.Fatal("AtMark after the read: true")
	}
	if AtMark(-1) {
		t.Fatal("AtMark(-1): true")
	}
}

func TestRecvInqWithoutTheOption(t *testing.T) {
	a, d := tcpPair(t, false)
	if _, err := unix.Write(d, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if n, inq := recvWhenQueued(t, a, make([]byte, 8)); n != 1 || inq != -1 {
		t.Fatalf("read %d, hint %d; want 1, -1 (no hint)", n, inq)
	}
}

func TestAcceptConnectAddresses(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			ln, err := net.Listen(network, map[string]string{"tcp4": "127.0.0.1:0", "tcp6": "[::1]:0"}[network])
			if err != nil {
				t.Skip(err)
			}
			defer ln.Close()
			target := ln.Addr().(*net.TCPAddr).AddrPort()
			family := unix.AF_INET
			if network == "tcp6" {
				family = unix.AF_INET6
			}
			fd, err := Socket(family)
			if err != nil {
				t.Fatal(err)
			}
			defer Close(fd)
			if err := SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
				t.Fatal(err)
			}
			if v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY); err != nil || v != 1 {
				t.Fatalf("TCP_NODELAY %d, %v", v, err)
			}
			if err := Connect(fd, target); err != nil && err != unix.EINPROGRESS {
				t.Fatal(err)
			}
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := SocketError(fd); err != nil {
				t.Fatalf("SO_ERROR after connect: %v", err)
			}
			local, err := unix.Getsockname(fd)
			if err != nil {
				t.Fatal(err)
			}
			var localPort int
			switch sa := local.(type) {
			case *unix.SockaddrInet4:
				localPort = sa.Port
			case *unix.SockaddrInet6:
				localPort = sa.Port
			}
			if got := c.RemoteAddr().(*net.TCPAddr).Port; got != localPort {
				t.Fatalf("connected from port %d, accepted from %d", localPort, got)
			}
		})
	}
}

func TestAccept4ReturnsThePeer(t *testing.T) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raw, err := l.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := c.LocalAddr().(*net.TCPAddr).AddrPort()
	var fd int
	var from netip.AddrPort
	for range 100 {
		_ = raw.Control(func(lfd uintptr) { fd, from, err = Accept4(int(lfd)) })
		if err != unix.EAGAIN {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer Close(fd)
	if from != want {
		t.Fatalf("accepted %v, want %v", from, want)
	}
	if fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); fl&unix.O_NONBLOCK == 0 {
		t.Fatal("accepted socket is blocking")
	}
}

// TCPState reads tcpi_state: ESTABLISHED on a connected socket, CLOSE_WAIT
// once the peer's FIN came, CLOSE once a reset came.
func TestTCPState(t *testing.T) {
	for _, tt := range []struct {
		name string
		end  func(peer *net.TCPConn)
		want int
	}{
		{"established", func(*net.TCPConn) {}, 1},
		{"peer's FIN", func(p *net.TCPConn) { _ = p.CloseWrite() }, TCPCloseWait},
		{"peer's reset", func(p *net.TCPConn) { _ = p.SetLinger(0); _ = p.Close() }, TCPClose},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, err := net.Dial("tcp4", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			peer, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			tt.end(peer.(*net.TCPConn))
			raw, _ := c.(*net.TCPConn).SyscallConn()
			var got int
			for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				_ = raw.Control(func(fd uintptr) { got = TCPState(int(fd)) })
				if got == tt.want || time.Now().After(deadline) {
					break
				}
			}
			if got != tt.want {
				t.Fatalf("state %d, want %d", got, tt.want)
			}
		})
	}
}
