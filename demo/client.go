package demo

import (
	"context"
	"fmt"
	"io"
	"net"
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

// accessTCP opens one new connection from the address from to proxy and
// returns what the backend said (its name).
func accessTCP(ctx context.Context, proxy netip.AddrPort, from netip.Addr) (string, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: ioTimeout, KeepAlive: -1}
	c, err := d.DialContext(ctx, "tcp4", proxy.String())
	if err != nil {
		return "", fmt.Errorf("from %s: %w", from, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	data, err := io.ReadAll(c)
	if err != nil {
		return "", fmt.Errorf("from %s: %w", from, err)
	}
	name := strings.TrimSpace(string(data))
	if name == "" {
		return "", fmt.Errorf("from %s: connection closed without an answer", from)
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
	return strings.TrimSpace(string(buf[:n])), nil
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
