package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// clientPair is a loopback connection: peer is the client's end, conn
// the proxy's (what a proxy socket accepted).
func clientPair(t *testing.T) (peer, conn *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err = net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	if conn, err = ln.AcceptTCP(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return peer, conn
}

// waitClosed waits until conn's socket took its peer's reset.
func waitClosed(t *testing.T, conn *net.TCPConn) {
	t.Helper()
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		state := -1
		_ = raw.Control(func(fd uintptr) { state = rawio.TCPState(int(fd)) })
		if state == rawio.TCPClose {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("TCP state %d 5 s after the peer's reset; want CLOSE", state)
		}
	}
}

// An attempt for a client whose connect gets no answer ends when the
// client resets, not at its time: before its watch of the client started
// (a reset that came with the accept or during the first moment) or while
// the watch waits; and when the proxy closes the client (its stop resets
// its pending clients). The dial fails as cancelled and ClientGone says
// why. It went on for the attempt's whole time (here a minute).
func TestClientAttemptEndsWhenTheClientResets(t *testing.T) {
	d := net.Dialer{KeepAlive: -1, ControlContext: AttemptControl(DialControl(Liveness{}))}
	silent := silentBackend(t).String()
	reset := func(peer, conn *net.TCPConn) {
		_ = peer.SetLinger(0)
		peer.Close()
		waitClosed(t, conn)
	}
	closeHere := func(_, conn *net.TCPConn) { conn.Close() }
	for _, tc := range []struct {
		name    string
		end     func(peer, conn *net.TCPConn)
		watched bool // ended once the watch started
	}{
		{"reset before the watch", reset, false},
		{"reset while watched", reset, true},
		{"closed here before the watch", closeHere, false},
		{"closed here while watched", closeHere, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer, conn := clientPair(t)
			if !tc.watched {
				tc.end(peer, conn)
			}
			a := NewClientAttempt(time.Minute, conn)
			type result struct {
				err  error
				took time.Duration
			}
			done := make(chan result, 1)
			start := time.Now()
			go func() {
				c, err := d.DialContext(a, "tcp4", silent)
				if c != nil {
					c.Close()
				}
				a.Stop()
				done <- result{err, time.Since(start)}
			}()
			if tc.watched {
				for end := time.Now().Add(5 * time.Second); !a.watching(); time.Sleep(time.Millisecond) {
					if time.Now().After(end) {
						t.Fatal("the attempt never watched its client")
					}
				}
				tc.end(peer, conn)
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the dial went on 10 s after its client ended")
			}
			if !errors.Is(r.err, context.Canceled) || !a.ClientGone() {
				t.Fatalf("dial ended after %v with %v, client gone %v; want it cancelled for the client's end",
					r.took, r.err, a.ClientGone())
			}
		})
	}
}

// A client that sends its request and its FIN while the attempt dials is
// not gone: the attempt ends at its time, as without a client, and the
// proxy then reads the request and the FIN (Stop cleared the watch's read
// deadline). A dial the backend answers at once starts no watch.
func TestClientAttemptSparesAClientThatStays(t *testing.T) {
	d := net.Dialer{KeepAlive: -1, ControlContext: AttemptControl(DialControl(Liveness{}))}
	peer, conn := clientPair(t)
	const timeout = 300 * time.Millisecond
	a := NewClientAttempt(timeout, conn)
	go func() {
		for end := time.Now().Add(5 * time.Second); !a.watching() && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		_, _ = peer.Write([]byte("request"))
		_ = peer.CloseWrite()
	}()
	start := time.Now()
	c, err := d.DialContext(a, "tcp4", silentBackend(t).String())
	a.Stop()
	took := time.Since(start)
	if err == nil {
		c.Close()
		t.Fatal("a dial to a listener that drops SYNs connected")
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || a.ClientGone() || took < timeout {
		t.Fatalf("dial ended after %v with %v, client gone %v; want a timeout at %v", took, err, a.ClientGone(), timeout)
	}
	// A deadline the watch left would fail this read at once.
	buf := make([]byte, 16)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("the proxy's read after the attempt: %v; want the client's request", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := io.ReadAll(conn)
	if got := string(buf[:n]) + string(rest); got != "request" || err != nil {
		t.Fatalf("the proxy read %q, %v after the attempt; want %q, then the FIN", got, err, "request")
	}

	a = NewClientAttempt(time.Minute, conn)
	c, err = d.DialContext(a, "tcp4", acceptingBackend(t))
	a.Stop()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if a.watching() {
		t.Error("a dial answered at once watched its client")
	}
}

// acceptingBackend is a listener that accepts every connection and
// closes it.
func acceptingBackend(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// watching tells whether the attempt started watching its client.
func (a *Attempt) watching() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.watched != nil
}
