package httpserver

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func startTest(t *testing.T, l Limits) string {
	t.Helper()
	srv, addr, err := Start("127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return addr.String()
}

// TestSlowlorisCutAtHeaderTimeout: a client that sends one header line
// every 100 ms and never ends its headers is disconnected at the header
// timeout, not kept as long as it keeps trickling.
func TestSlowlorisCutAtHeaderTimeout(t *testing.T) {
	const headerTimeout = 500 * time.Millisecond
	addr := startTest(t, Limits{ReadHeaderTimeout: headerTimeout, IdleTimeout: time.Minute, MaxConns: 10})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: test\r\n"); err != nil {
		t.Fatal(err)
	}
	cut := make(chan time.Duration, 1)
	go func() {
		// The server answers nothing and closes: Read sees EOF (or a reset).
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err := io.Copy(io.Discard, c)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			cut <- time.Since(start)
		}
		close(cut)
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case d, ok := <-cut:
			if !ok {
				t.Fatal("the slow header sender was still connected after 20 s")
			}
			if d < headerTimeout-50*time.Millisecond {
				t.Errorf("cut after %v, before the %v header timeout", d, headerTimeout)
			}
			t.Logf("slow header sender cut after %v (header timeout %v)", d, headerTimeout)
			return
		case <-tick.C:
			_, _ = io.WriteString(c, "X-Slow: 1\r\n") // fails once the server closed; the reader reports
		}
	}
}

// TestCapMakesClientsWait: with a cap of 1, a second connection is not
// served while the first is busy with a request, and is served as soon as
// that connection closes.
func TestCapMakesClientsWait(t *testing.T) {
	addr, release := startWithSlowPath(t, 1)
	first := dialSlow(t, addr)
	defer first.Close()
	second := dialGet(t, addr)
	defer second.Close()
	_ = second.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := http.ReadResponse(bufio.NewReader(second), nil); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("second connection answered while the first held the only slot with a request: %v", err)
	}
	close(release)
	if _, err := http.ReadResponse(bufio.NewReader(first), nil); err != nil {
		t.Fatalf("first connection: %v", err)
	}
	first.Close()
	_ = second.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := http.ReadResponse(bufio.NewReader(second), nil); err != nil {
		t.Fatalf("second connection not served after the first closed: %v", err)
	}
}

// TestCapIdleKeepAliveGivesWay: clients that keep every slot with idle
// keep-alive connections (one request each, then silence within the idle
// timeout) do not lock a probe out: at the cap the longest-idle one is
// closed for it. Before, the probe waited until an idle timeout.
func TestCapIdleKeepAliveGivesWay(t *testing.T) {
	const slots = 5
	addr, held := fillWithIdle(t, slots)
	time.Sleep(50 * time.Millisecond) // each is idle now
	for i := range 3 {
		probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := probe.Get("http://" + addr + "/healthz")
		if err != nil {
			t.Fatalf("probe %d with every slot held by an idle keep-alive connection: %v", i, err)
		}
		resp.Body.Close()
	}
	// An idle connection gave way (the longest idle: which one that is
	// depends on when the server marked each idle); each probe closed
	// its own connection, so the next ones usually found a free slot.
	closed := 0
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			closed++
		}
	}
	if closed < 1 || closed > 3 {
		t.Errorf("%d idle connections were closed for 3 probes, want 1 to 3", closed)
	}
}

// fillWithIdle starts a server capped at slots connections and fills them
// with keep-alive connections that made one request each.
func fillWithIdle(t *testing.T, slots int) (string, []net.Conn) {
	t.Helper()
	addr := startTest(t, Limits{ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute, MaxConns: slots})
	var held []net.Conn
	for range slots {
		c := dialGet(t, addr)
		t.Cleanup(func() { c.Close() })
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	return addr, held
}

// startWithSlowPath serves "ok", on /slow only once release is closed.
func startWithSlowPath(t *testing.T, maxConns int) (addr string, release chan struct{}) {
	t.Helper()
	release = make(chan struct{})
	srv, bound, err := Start("127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	}), Limits{ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute, MaxConns: maxConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return bound.String(), release
}

// dialSlow sends GET /slow: the connection is busy until release.
func dialSlow(t *testing.T, addr string) net.Conn { return dialPath(t, addr, "/slow") }

func dialGet(t *testing.T, addr string) net.Conn { return dialPath(t, addr, "/") }

// dialPath connects to addr and sends GET path.
func dialPath(t *testing.T, addr, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCapWaitingClientTakesANewlyIdleSlot: a client that arrived while
// every connection was busy is served as soon as one of them finishes its
// request and goes idle (that one gives way), not at its idle timeout.
func TestCapWaitingClientTakesANewlyIdleSlot(t *testing.T) {
	addr, release := startWithSlowPath(t, 1)
	busy := dialSlow(t, addr)
	defer busy.Close()
	waiting := dialGet(t, addr)
	defer waiting.Close()
	time.Sleep(100 * time.Millisecond) // the server's Accept waits for the slot
	close(release)
	if _, err := http.ReadResponse(bufio.NewReader(busy), nil); err != nil {
		t.Fatalf("busy connection: %v", err)
	}
	// busy stays open, idle: it must give way to the waiting client.
	_ = waiting.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := http.ReadResponse(bufio.NewReader(waiting), nil); err != nil {
		t.Fatalf("the waiting client was not served once the busy connection went idle: %v", err)
	}
}

// A capped Accept waiting for a slot returns once the listener is closed,
// so the server's Serve ends with Close.
func TestCapWaitingAcceptEndsAtClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	capped := newCapListener(ln, 1)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	held, err := capped.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	// A second client: its Accept waits for the slot.
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	got := make(chan error, 1)
	go func() {
		_, err := capped.Accept()
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	capped.Close()
	select {
	case err := <-got:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting Accept did not return after Close")
	}
}

// TestCapKeepsIdleConnectionsWithNoOneWaiting: at the cap, idle keep-alive
// connections stay open while no other client comes (a slot taken ahead of
// the next client closed one: the cap was one less, and keep-alive
// clients at the cap pushed each other out in turn).
func TestCapKeepsIdleConnectionsWithNoOneWaiting(t *testing.T) {
	const slots = 2
	_, held := fillWithIdle(t, slots)
	time.Sleep(200 * time.Millisecond)
	for i, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("idle connection %d of %d (the cap) closed with no other client: %v", i, slots, err)
		}
	}
}

// TestCapHeaderTricklersGiveWay: clients that fill every slot with
// requests whose headers never end (slowloris, each cut only at the header
// timeout and back at once) do not lock a probe out: at the cap the
// connection that has read the longest without a request to serve is
// closed for it. Before, they counted as busy with a request and the probe
// waited in the backlog (/healthz answered after 9.5 s under 300 of them).
func TestCapHeaderTricklersGiveWay(t *testing.T) {
	const slots = 3
	addr := startTest(t, Limits{ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxConns: slots})
	for range slots {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: test\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // every slot taken, headers unfinished
	probe := dialGet(t, addr)
	defer probe.Close()
	start := time.Now()
	_ = probe.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := http.ReadResponse(bufio.NewReader(probe), nil); err != nil {
		t.Fatalf("probe not answered while %d clients trickled headers into every slot: %v after %v", slots, err, time.Since(start))
	}
}

// A request that arrived whole while the server was too busy to read it
// is not taken for a slow client's at the cap: the server is behind, not
// the client. Cut as one that had "read" for readingGrace, such requests
// went unanswered on a loaded machine (TestHealthServerIdleTimeoutAndCap:
// "client: unexpected EOF" for 2 of 200).
func TestCapSparesARequestTheServerHasNotRead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newCapListener(ln, 1)
	defer l.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := io.WriteString(a, "GET / HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// The server's side of a, which it does not read: a server held up.
	sa, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(readingGrace + 100*time.Millisecond)
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Its request sent, as a client's is at once: one silent for
	// readingGrace at the cap is closed (TestCapSilentQueueGivesWay).
	if _, err := io.WriteString(b, "GET / HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	_ = a.SetReadDeadline(time.Now().Add(2 * readingGrace))
	if n, err := a.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the client whose request the server had not read yet: read %d bytes, %v; want it still waiting for its answer", n, err)
	}
	// Done with a, the server has b's slot.
	sa.Close()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting client did not get the slot given back")
	}
}

// TestHeadersBounded: a request's headers are bounded well below
// net/http's 1 MiB default, which let 100 connections that each sent one
// unfinished 1 MB header line take the proxy from 33 MB to 237 MB; a
// request with the headers our clients send (probes, scrapers with a
// bearer token) is served.
func TestHeadersBounded(t *testing.T) {
	addr := startTest(t, DefaultLimits)
	get := func(header int) int {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		req := "GET / HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer " + strings.Repeat("a", header) + "\r\n\r\n"
		go func() { _, _ = io.WriteString(c, req) }() // the server may answer before reading it all
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("a request with a %d-byte header: %v", header, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(4 << 10); code != http.StatusOK {
		t.Errorf("a request with a 4 KiB token: %d, want 200", code)
	}
	if code := get(64 << 10); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a request with 64 KiB of headers: %d, want 431", code)
	}
}

// TestCapBodyTricklersGiveWay: clients that fill every slot with whole
// requests whose declared body comes a byte at a time do not lock a probe
// out, whether the handler leaves the body (net/http then reads it after
// the handler, up to ReadTimeout, while the connection counts as serving:
// /livez answered after 37 s under 400 of them) or reads it (the fault
// API's bodies).
func TestCapBodyTricklersGiveWay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"body left", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }},
		{"body read", func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.ReadAll(r.Body); err != nil {
				return
			}
			_, _ = io.WriteString(w, "ok")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const slots = 3
			l := DefaultLimits
			l.MaxConns = slots
			srv, bound, err := Start("127.0.0.1:0", tc.handler, l)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			addr := bound.String()
			for range slots {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: test\r\nContent-Length: 100000\r\n\r\na"); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(100 * time.Millisecond) // every slot taken, bodies unfinished
			probe := dialGet(t, addr)
			defer probe.Close()
			start := time.Now()
			_ = probe.SetReadDeadline(time.Now().Add(3 * time.Second))
			if _, err := http.ReadResponse(bufio.NewReader(probe), nil); err != nil {
				t.Fatalf("probe not answered while %d clients trickled request bodies into every slot: %v after %v", slots, err, time.Since(start))
			}
		})
	}
}

// TestCapSilentQueueGivesWay: connections that never send a byte, queued
// in the listen backlog ahead of a probe, do not hold it back: at the cap
// the server could take only as many new clients per readingGrace as it
// had slots, one after another in the kernel's order, so the probe waited
// behind every one (/healthz took 10 s under 5,000 of them, kept up by
// reconnecting). One that has been silent for readingGrace when it is
// accepted at the cap is closed at once.
func TestCapSilentQueueGivesWay(t *testing.T) {
	const slots, queued = 2, 40
	l := DefaultLimits
	l.MaxConns = slots
	addr := startTest(t, l)
	for range slots + queued {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	probe := dialGet(t, addr)
	defer probe.Close()
	start := time.Now()
	// 40 queued at 2 per 250 ms took 5 s.
	_ = probe.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := http.ReadResponse(bufio.NewReader(probe), nil); err != nil {
		t.Fatalf("probe not answered behind %d silent connections queued at the cap: %v after %v", queued, err, time.Since(start))
	}
	t.Logf("probe answered after %v", time.Since(start))
}

// silent closes a client accepted at the cap whose request head has not
// come whole in readingGrace, and only such a client: a head whose lines
// end in a bare LF, which net/http reads as it reads CRLF (a probe written
// with printf and nc), came whole too, and was closed unanswered when it
// had waited in the backlog for the grace.
func TestSilentSeesEveryWholeHead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct {
		name, sent string
		silent     bool
	}{
		{"CRLF", "GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n", false},
		{"bare LF", "GET /healthz HTTP/1.0\n\n", false},
		{"LF lines, CRLF blank line", "GET /healthz HTTP/1.0\nHost: node\n\r\n", false},
		{"head unfinished", "GET /healthz HTTP/1.1\r\nHost: node\r\n", true},
		{"nothing sent", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			if _, err := io.WriteString(client, tc.sent); err != nil {
				t.Fatal(err)
			}
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// Until the kernel says nothing came for the grace: what the
			// cap sees of a client queued that long.
			raw, err := c.(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				var quiet time.Duration
				_ = raw.Control(func(fd uintptr) {
					if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
						quiet = time.Duration(info.Last_data_recv) * time.Millisecond
					}
				})
				if quiet >= readingGrace {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("TCP_INFO's last_data_recv still %v after 10 s", quiet)
				}
			}
			if got := silent(c); got != tc.silent {
				t.Fatalf("sent %q, quiet for the grace: silent %v, want %v", tc.sent, got, tc.silent)
			}
		})
	}
}
