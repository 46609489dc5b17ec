package backend

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server is one named backend answering on a TCP listener and, optionally, a
// UDP socket (usually the same address), in one of two Modes.
//
// Ask, TCP: the client sends one line. An HTTP request line ("GET / HTTP/1.1")
// gets an HTTP/1.1 200 response whose body is "NAME\n". A line "ECHO" gets
// "NAME REMOTE\n" and then everything else the client sends echoed back until
// the client half-closes. Any other line gets "NAME REMOTE\n" and the
// connection is closed. REMOTE is the peer address the backend sees.
//
// Ask, UDP: every datagram gets one reply "NAME REMOTE\n"; when the datagram
// starts with "ECHO" the datagram itself is appended, so large-datagram tests
// can check nothing was truncated.
//
// Demo, for a person trying a Service by hand: TCP is HTTP/1.1 (a request
// gets 200 with body "NAME\n", so curl works; any other line gets "NAME\n");
// UDP echoes, every datagram coming back prefixed with "NAME: ".
type Server struct {
	Name string
	mode Mode

	tcp *net.TCPListener
	udp *net.UDPConn // nil: TCP only
	// logf reports errors other than the sockets being closed; nil drops them.
	logf func(format string, args ...any)

	loops sync.WaitGroup // the accept and UDP loops
	conns sync.WaitGroup // TCP connections being answered
	once  sync.Once

	mu      sync.Mutex
	closed  bool
	echoing map[*net.TCPConn]struct{} // ECHO streams, cut by Close

	answered atomic.Int64
	// udpDelay holds each UDP reply back this long (nanoseconds; 0: at
	// once), as a slow or loaded backend answers: see SetUDPDelay.
	udpDelay atomic.Int64
}

// SetUDPDelay makes every later UDP reply leave d after its datagram came
// (each on its own timer, so replies still overlap), so that a test can
// keep queries in flight while something else changes.
func (s *Server) SetUDPDelay(d time.Duration) { s.udpDelay.Store(int64(d)) }

// Mode is who speaks first.
type Mode int

const (
	// Ask: the client sends a request and the server answers it with its name
	// and the client's address, as the suites' probes expect.
	Ask Mode = iota
	// Demo: HTTP/1.1 and a UDP echo that name the backend, for the demo
	// and whoever tries its Services with curl or nc.
	Demo
)

// requestTimeout bounds the wait for a client's request line, so a client
// that connects and says nothing cannot hold a goroutine for long.
const requestTimeout = 10 * time.Second

// Serve answers as name, in mode, on tcp and udp (nil: TCP only) until
// Close. The sockets may have been opened anywhere, inside a network namespace
// too; the Server owns them from now on. logf, when not nil, gets the errors
// that do not stop the server (an accept failing with EMFILE, say).
func Serve(name string, mode Mode, tcp *net.TCPListener, udp *net.UDPConn, logf func(format string, args ...any)) *Server {
	s := &Server{Name: name, mode: mode, tcp: tcp, udp: udp, logf: logf, echoing: map[*net.TCPConn]struct{}{}}
	s.loops.Add(1)
	go s.acceptLoop()
	if udp != nil {
		s.loops.Add(1)
		go s.udpLoop()
	}
	return s
}

// Listen opens TCP and (unless tcpOnly) UDP on addr ("IP:port") in the
// current network namespace and serves there. With port 0 the two sockets get
// different ports: see TCPAddr and UDPAddr.
func Listen(name string, mode Mode, addr string, tcpOnly bool, logf func(format string, args ...any)) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", name, err)
	}
	var udp *net.UDPConn
	if !tcpOnly {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("backend %s: %w", name, err)
		}
		udp = pc.(*net.UDPConn)
	}
	return Serve(name, mode, ln.(*net.TCPListener), udp, logf), nil
}

// TCPAddr is the address the TCP listener is bound to.
func (s *Server) TCPAddr() netip.AddrPort { return s.tcp.Addr().(*net.TCPAddr).AddrPort() }

// UDPAddr is the address the UDP socket is bound to (zero when TCP only).
func (s *Server) UDPAddr() netip.AddrPort {
	if s.udp == nil {
		return netip.AddrPort{}
	}
	return s.udp.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Answers is how many requests (TCP and UDP) the server has answered so far.
func (s *Server) Answers() int { return int(s.answered.Load()) }

// Close stops accepting (new connections are refused from now on), lets every
// accepted connection get its answer, cuts ECHO streams, and returns once
// nothing of the server runs any more: the way a pod's server stops on
// SIGTERM. Calling it again does nothing.
func (s *Server) Close() {
	s.once.Do(func() {
		s.tcp.Close()
		if s.udp != nil {
			s.udp.Close()
		}
		s.loops.Wait()
		s.mu.Lock()
		s.closed = true
		for c := range s.echoing {
			c.Close()
		}
		s.mu.Unlock()
		s.conns.Wait()
	})
}

func (s *Server) log(format string, args ...any) {
	if s.logf != nil {
		s.logf("backend %s: "+format, append([]any{s.Name}, args...)...)
	}
}

func (s *Server) acceptLoop() {
	defer s.loops.Done()
	for {
		c, err := s.tcp.AcceptTCP()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			s.log("accept: %v", err)
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: back off instead of spinning
			continue
		}
		s.conns.Add(1)
		go s.answerTCP(c)
	}
}

func (s *Server) answerTCP(c *net.TCPConn) {
	defer s.conns.Done()
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(requestTimeout))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil && line == "" {
		return
	}
	line = strings.TrimSpace(line)
	remote := c.RemoteAddr().String()
	// Counted before the answer goes out, so a client that has its answer
	// sees it counted (counting after raced the client's next look).
	s.answered.Add(1)
	switch {
	case isHTTPRequestLine(line):
		drainHeaders(r)
		body := s.Name + "\n"
		_, err = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nX-Backend: %s\r\nConnection: close\r\n\r\n%s",
			len(body), s.Name, body)
	case s.mode == Demo:
		_, err = fmt.Fprintf(c, "%s\n", s.Name)
	case line == "ECHO":
		if !s.track(c) {
			s.answered.Add(-1)
			return
		}
		defer s.untrack(c)
		_ = c.SetReadDeadline(time.Time{})
		if _, err = fmt.Fprintf(c, "%s %s\n", s.Name, remote); err != nil {
			s.answered.Add(-1)
		} else {
			_, _ = io.Copy(c, r)
			_ = c.CloseWrite()
		}
		return
	default:
		_, err = fmt.Fprintf(c, "%s %s\n", s.Name, remote)
	}
	if err != nil {
		s.answered.Add(-1)
	}
}

// track registers an ECHO stream for Close to cut; false when Close has
// already run.
func (s *Server) track(c *net.TCPConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.echoing[c] = struct{}{}
	return true
}

func (s *Server) untrack(c *net.TCPConn) {
	s.mu.Lock()
	delete(s.echoing, c)
	s.mu.Unlock()
}

func isHTTPRequestLine(line string) bool {
	f := strings.Fields(line)
	return len(f) == 3 && strings.HasPrefix(f[2], "HTTP/")
}

func drainHeaders(r *bufio.Reader) {
	for {
		l, err := r.ReadString('\n')
		if err != nil || strings.TrimSpace(l) == "" {
			return
		}
	}
}

func (s *Server) udpLoop() {
	defer s.loops.Done()
	buf := make([]byte, 64*1024) // the largest datagram: ECHO tests check nothing is cut
	for {
		n, from, err := s.udp.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			s.log("udp read: %v", err)
			continue
		}
		var reply []byte
		switch s.mode {
		case Demo:
			reply = append([]byte(s.Name+": "), buf[:n]...)
		case Ask:
			// Unmapped: a wildcard listener is dual-stack and sees IPv4 peers as ::ffff:a.b.c.d.
			reply = fmt.Appendf(nil, "%s %s\n", s.Name, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()))
			if strings.HasPrefix(string(buf[:min(n, 4)]), "ECHO") {
				reply = append(reply, buf[:n]...)
			}
		}
		if d := time.Duration(s.udpDelay.Load()); d > 0 {
			time.AfterFunc(d, func() {
				s.answered.Add(1)
				if _, err := s.udp.WriteToUDPAddrPort(reply, from); err != nil {
					s.answered.Add(-1)
					if !errors.Is(err, net.ErrClosed) {
						s.log("udp write: %v", err)
					}
				}
			})
			continue
		}
		s.answered.Add(1)
		if _, err := s.udp.WriteToUDPAddrPort(reply, from); err != nil {
			s.answered.Add(-1)
			s.log("udp write: %v", err)
		}
	}
}
