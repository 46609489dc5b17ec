package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// ioTimeout bounds every demo connection: loopback answers in well under
// a millisecond, so a stuck access is a proxy problem worth reporting.
const ioTimeout = 3 * time.Second

// clientIP is the n-th demo client address, 127.0.0.n. Linux routes all of
// 127.0.0.0/8 to lo, so an unprivileged socket can bind any of them, and the
// proxy, which keys affinity on the client IP, sees distinct clients.
func clientIP(n int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, byte(n)}) }

// request is what curl sends, on a connection of its own.
const request = "GET / HTTP/1.1\r\nHost: demo\r\nUser-Agent: kube-userspace-proxy-demo\r\nConnection: close\r\n\r\n"

// accessTCP makes one HTTP request over a new connection from the address
// from to proxy and returns the backend's answer (its name). The request is
// written by hand, not by net/http's client, so that the connection is
// exactly one and a reset reaches the caller as ECONNRESET, unretried.
func accessTCP(ctx context.Context, proxy netip.AddrPort, from netip.Addr) (string, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: ioTimeout, KeepAlive: -1}
	c, err := d.DialContext(ctx, "tcp4", proxy.String())
	if err != nil {
		return "", fmt.Errorf("from %s: %w", from, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := io.WriteString(c, request); err != nil {
		return "", fmt.Errorf("from %s: %w", from, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return "", fmt.Errorf("from %s: connection closed without an answer", from)
		}
		return "", fmt.Errorf("from %s: %w", from, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("from %s: %w", from, err)
	}
	name := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK || name == "" {
		return "", fmt.Errorf("from %s: answer %q with no backend name", from, resp.Status)
	}
	return name, nil
}

// accessUDP sends one datagram from a new socket on from (a new UDP session
// for the proxy) and returns the backend's answer.
func accessUDP(proxy netip.AddrPort, from netip.Addr) (string, error) {
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)))
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := c.WriteToUDPAddrPort([]byte("who are you?\n"), proxy); err != nil {
		return "", err
	}
	buf := make([]byte, 512)
	n, src, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		return "", fmt.Errorf("from %s: %w", from, err)
	}
	if src != proxy {
		// The client must see the answer come from the address it sent to.
		return "", fmt.Errorf("answer came from %s, not from the proxy %s", src, proxy)
	}
	// The backend echoes the datagram after its name: "backend-a: who are you?".
	name, _, _ := strings.Cut(string(buf[:n]), ":")
	return strings.TrimSpace(name), nil
}

// accessMany makes n sequential TCP accesses and returns the answers.
func accessMany(ctx context.Context, proxy netip.AddrPort, from netip.Addr, n int) ([]string, error) {
	out := make([]string, 0, n)
	for range n {
		name, err := accessTCP(ctx, proxy, from)
		if err != nil {
			return out, err
		}
		out = append(out, name)
	}
	return out, nil
}

// sleepUntil waits for t or for ctx to end, whichever is first.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
