package backend

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func listenLoopback(t *testing.T, name string) *Server {
	t.Helper()
	s, err := Listen(name, Ask, "127.0.0.1:0", true, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// dial connects to s's TCP listener, with a deadline for the whole exchange;
// the connection is closed when t ends.
func dial(t *testing.T, s *Server) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", s.TCPAddr().String(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	return c.(*net.TCPConn)
}

// request sends one line over a new connection and returns everything the
// server wrote before closing.
func request(t *testing.T, s *Server, line string) string {
	t.Helper()
	c := dial(t, s)
	if _, err := io.WriteString(c, line); err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func TestServerTCP(t *testing.T) {
	s := listenLoopback(t, "b1")
	if got := request(t, s, "who\n"); !strings.HasPrefix(got, "b1 127.0.0.1:") {
		t.Errorf("line request answered %q", got)
	}
	got := request(t, s, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 200 OK\r\n") || !strings.Contains(got, "X-Backend: b1\r\n") || !strings.HasSuffix(got, "\r\n\r\nb1\n") {
		t.Errorf("HTTP request answered %q", got)
	}
	if n := s.Answers(); n != 2 {
		t.Errorf("Answers() = %d, want 2", n)
	}
}

func TestServerEcho(t *testing.T) {
	s := listenLoopback(t, "b2")
	c := dial(t, s)
	payload := bytes.Repeat([]byte("0123456789"), 10000)
	go func() {
		_, _ = io.WriteString(c, "ECHO\n")
		_, _ = c.Write(payload)
		_ = c.CloseWrite()
	}()
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "b2 ") {
		t.Fatalf("ECHO head %q, %v", head, err)
	}
	back, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(back, payload) {
		t.Errorf("ECHO returned %d bytes (err %v), want the %d sent", len(back), err, len(payload))
	}
}

// TestServerCloseCutsEcho: Close returns although a client holds an ECHO
// stream open, and refuses new connections afterwards.
func TestServerCloseCutsEcho(t *testing.T) {
	s := listenLoopback(t, "b3")
	c := dial(t, s)
	_, _ = io.WriteString(c, "ECHO\n")
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not return while an ECHO stream was open")
	}
	if c2, err := net.DialTimeout("tcp", s.TCPAddr().String(), time.Second); err == nil {
		c2.Close()
		t.Error("closed server still accepts")
	}
}

func TestServerUDP(t *testing.T) {
	s, err := Listen("u1", Ask, "127.0.0.1:0", false, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dst := s.UDPAddr() // port 0: not the TCP port
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 70000)
	for _, req := range []string{"who\n", "ECHO " + strings.Repeat("x", 60000)} {
		if _, err := c.WriteToUDPAddrPort([]byte(req), dst); err != nil {
			t.Fatal(err)
		}
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		want := "u1 " + c.LocalAddr().String() + "\n"
		if strings.HasPrefix(req, "ECHO") {
			want += req
		}
		if got := string(buf[:n]); got != want || from != dst {
			t.Errorf("datagram of %d bytes answered with %d bytes from %s, want %d from %s", len(req), n, from, len(want), dst)
		}
	}
}

// With a UDP delay each reply leaves that long after its datagram; replies
// wait on their own timers, so the second query is not held behind the
// first.
func TestServerUDPDelay(t *testing.T) {
	s, err := Listen("u1", Ask, "127.0.0.1:0", false, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const d = 150 * time.Millisecond
	s.SetUDPDelay(d)
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	start := time.Now()
	for range 2 {
		if _, err := c.WriteToUDPAddrPort([]byte("who\n"), s.UDPAddr()); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 64)
	for i := range 2 {
		if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
	}
	if took := time.Since(start); took < d {
		t.Fatalf("two replies delayed %v came after %v", d, took)
	}
}

// TestServerDemo: curl's request gets an HTTP/1.1 answer naming the
// backend, a plain line gets the name, and a datagram is echoed after the
// name.
func TestServerDemo(t *testing.T) {
	s, err := Listen("d1", Demo, "127.0.0.1:0", false, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := dial(t, s)
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("HTTP answer: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || resp.ProtoMajor != 1 || resp.ProtoMinor != 1 || string(body) != "d1\n" {
		t.Errorf("HTTP answer %s %d, body %q, %v", resp.Proto, resp.StatusCode, body, err)
	}
	if got := request(t, s, "hello\n"); got != "d1\n" {
		t.Errorf("plain line answered %q", got)
	}
	u, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(s.UDPAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	_ = u.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	if _, err := u.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	if n, err := u.Read(buf); err != nil || string(buf[:n]) != "d1: hi\n" {
		t.Errorf("UDP reply %q, %v", buf[:n], err)
	}
	if n := s.Answers(); n != 3 {
		t.Errorf("Answers() = %d, want 3", n)
	}
}
