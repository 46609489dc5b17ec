// Command backend is the test backend: it listens on one address for TCP and
// UDP and answers every request with its own name, so a test can tell which
// backend a proxied connection reached.
//
// TCP: the client sends one line. An HTTP request line ("GET / HTTP/1.1")
// gets an HTTP/1.1 200 response whose body is "NAME\n". A line "ECHO" gets
// "NAME REMOTE\n" and then everything else the client sends echoed back until
// the client half-closes. Any other line gets "NAME REMOTE\n" and the
// connection is closed. REMOTE is the peer address the backend sees.
//
// UDP: every datagram gets one reply "NAME REMOTE\n"; when the datagram
// starts with "ECHO" the datagram itself is appended, so large-datagram tests
// can check nothing was truncated.
//
// When both listeners are up it prints "READY NAME ADDR" on stdout.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"time"
)

func main() {
	name := flag.String("name", "backend", "name sent back in every answer")
	addr := flag.String("addr", "127.0.0.1:8080", "IP:port to listen on, TCP and UDP")
	noUDP := flag.Bool("no-udp", false, "listen on TCP only")
	flag.Parse()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("backend %s: %v", *name, err)
	}
	if !*noUDP {
		pc, err := net.ListenPacket("udp", *addr)
		if err != nil {
			log.Fatalf("backend %s: %v", *name, err)
		}
		go serveUDP(pc, *name)
	}
	fmt.Printf("READY %s %s\n", *name, *addr)
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Printf("backend %s: accept: %v", *name, err)
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: back off instead of spinning
			continue
		}
		go serveTCP(c.(*net.TCPConn), *name)
	}
}

func serveTCP(c *net.TCPConn, name string) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil && line == "" {
		return
	}
	line = strings.TrimSpace(line)
	remote := c.RemoteAddr().String()
	switch {
	case isHTTPRequestLine(line):
		drainHeaders(r)
		body := name + "\n"
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nX-Backend: %s\r\nConnection: close\r\n\r\n%s",
			len(body), name, body)
	case line == "ECHO":
		_ = c.SetReadDeadline(time.Time{})
		fmt.Fprintf(c, "%s %s\n", name, remote)
		_, _ = io.Copy(c, r)
		_ = c.CloseWrite()
	default:
		fmt.Fprintf(c, "%s %s\n", name, remote)
	}
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

func serveUDP(pc net.PacketConn, name string) {
	buf := make([]byte, 65536)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			log.Printf("backend %s: udp read: %v", name, err)
			continue
		}
		reply := []byte(fmt.Sprintf("%s %s\n", name, from))
		if strings.HasPrefix(string(buf[:min(n, 4)]), "ECHO") {
			reply = append(reply, buf[:n]...)
		}
		if _, err := pc.WriteTo(reply, from); err != nil {
			log.Printf("backend %s: udp write: %v", name, err)
		}
	}
}
