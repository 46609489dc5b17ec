package relay

import (
	"io"
	"net"
	"testing"
	"time"
)

// dialHolding dials backend as the goroutine relay does (DialControl).
func dialHolding(t *testing.T, backend *net.TCPListener) *net.TCPConn {
	t.Helper()
	d := net.Dialer{KeepAlive: -1, Control: DialControl(Liveness{})}
	c, err := d.Dial("tcp4", backend.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// A client whose request is queued when the dial completes has its first
// bytes carry the handshake's last ACK: the backend's socket sees two
// segments (SYN, the request with the ACK), not three.
func TestHandshakeACKRidesOnTheFirstBytes(t *testing.T) {
	backendLn, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer backendLn.Close()
	client, proxySide := plainPair(t) // the client's end, the proxy's
	const req = "GET / HTTP/1.1\r\n\r\n"
	if _, err := client.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); queuedBytes(proxySide) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request never arrived")
		}
	}
	backend := dialHolding(t, backendLn)
	ReleaseHandshakeACK(backend, proxySide, false)
	buf := make([]byte, len(req))
	if _, err := io.ReadFull(proxySide, buf); err != nil {
		t.Fatal(err)
	}
	if _, err := backend.Write(buf); err != nil {
		t.Fatal(err)
	}
	_ = backendLn.SetDeadline(time.Now().Add(5 * time.Second))
	server, err := backendLn.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if _, err := io.ReadFull(server, buf); err != nil {
		t.Fatal(err)
	}
	if n := segmentsIn(t, server); n != 2 {
		t.Fatalf("the backend received %d segments for handshake and request, want 2 (SYN, request with the ACK)", n)
	}
}

// With nothing queued (the server speaks first), or forced (a faulted
// connection), the ACK goes at once: the backend accepts without waiting
// for the kernel's delayed-ACK timer (200 ms).
func TestHandshakeACKReleasedWhenNothingIsQueued(t *testing.T) {
	for _, tc := range []struct {
		name  string
		queue bool
		force bool
	}{{"nothing queued", false, false}, {"forced", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			backendLn, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer backendLn.Close()
			client, proxySide := plainPair(t) // the client's end, the proxy's
			if tc.queue {
				if _, err := client.Write([]byte("x")); err != nil {
					t.Fatal(err)
				}
				for queuedBytes(proxySide) == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			start := time.Now()
			backend := dialHolding(t, backendLn)
			ReleaseHandshakeACK(backend, proxySide, tc.force)
			_ = backendLn.SetDeadline(time.Now().Add(5 * time.Second))
			server, err := backendLn.AcceptTCP()
			if err != nil {
				t.Fatal(err)
			}
			defer server.Close()
			if took := time.Since(start); took >= 150*time.Millisecond {
				t.Fatalf("the backend accepted %v after the dial: the handshake's ACK waited for the delayed-ACK timer", took)
			}
		})
	}
}

// Without the release, the dial's held ACK is what delays the backend: the
// test above would not show a difference otherwise.
func TestHandshakeACKHeldWithoutRelease(t *testing.T) {
	backendLn, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer backendLn.Close()
	start := time.Now()
	dialHolding(t, backendLn)
	_ = backendLn.SetDeadline(time.Now().Add(5 * time.Second))
	server, err := backendLn.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Fatalf("the backend accepted %v after a holding dial: the ACK was not held", took)
	}
}
