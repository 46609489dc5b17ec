package relay

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sockopts reads what Liveness sets from a socket.
func sockopts(t *testing.T, c *net.TCPConn) [5]int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var out [5]int
	var gerr error
	_ = raw.Control(func(fd uintptr) {
		for i, o := range []struct{ level, name int }{
			{unix.SOL_SOCKET, unix.SO_KEEPALIVE}, {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
			{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL}, {unix.IPPROTO_TCP, unix.TCP_KEEPCNT},
			{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT},
		} {
			if out[i], gerr = unix.GetsockoptInt(int(fd), o.level, o.name); gerr != nil {
				return
			}
		}
	})
	if gerr != nil {
		t.Fatal(gerr)
	}
	return out
}

// Set once on the listener, the options reach every accepted socket (so
// the client side costs nothing per connection); a dialer's Control sets
// them on the backend side before connect.
func TestLivenessInheritedByAcceptAndSetByDial(t *testing.T) {
	l := Liveness{KeepAliveIdle: 7 * time.Second, KeepAliveInterval: 3 * time.Second, KeepAliveCount: 4, UserTimeout: 2500 * time.Millisecond}
	want := [5]int{1, 7, 3, 4, 2500}
	lc := net.ListenConfig{KeepAlive: -1, Control: l.Control}
	lc.SetMultipathTCP(false) // as the proxier listens (Go's default is MPTCP)
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{KeepAlive: -1, Control: l.Control}
	dialed, err := d.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	accepted, err := ln.(*net.TCPListener).AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	if got := sockopts(t, accepted); got != want {
		t.Errorf("accepted socket: keepalive, idle, interval, count, user timeout = %v, want %v", got, want)
	}
	if got := sockopts(t, dialed.(*net.TCPConn)); got != want {
		t.Errorf("dialed socket: %v, want %v", got, want)
	}
}

// The zero Liveness touches nothing, and UDP sockets are left alone.
func TestLivenessOffAndUDP(t *testing.T) {
	lc := net.ListenConfig{KeepAlive: -1, Control: Liveness{}.Control}
	lc.SetMultipathTCP(false) // as the proxier listens (Go's default is MPTCP)
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := ln.(*net.TCPListener).AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := sockopts(t, a); got[0] != 0 || got[4] != 0 {
		t.Errorf("zero Liveness: keepalive %d, user timeout %d; want both off", got[0], got[4])
	}
	udp := net.ListenConfig{Control: livenessForTest.Control}
	pc, err := udp.ListenPacket(context.Background(), "udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("UDP socket with Liveness.Control: %v", err)
	}
	pc.Close()
}

var livenessForTest = Liveness{KeepAliveIdle: time.Second, KeepAliveInterval: time.Second, KeepAliveCount: 1, UserTimeout: time.Second}

func TestSecondsRoundsUp(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{{time.Millisecond, 1}, {time.Second, 1}, {1500 * time.Millisecond, 2}, {30 * time.Second, 30}} {
		if got := seconds(c.d); got != c.want {
			t.Errorf("seconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}
