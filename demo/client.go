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

// client is a demo client by its number: its address is the number as the
// last byte of the network's client prefix (127.0.0.n on loopback).
type client int

// clientNet is where the clients' sockets are opened: on this machine's
// loopback, or inside the client namespace of demo --netns.
type clientNet interface {
	// addr is client c's source address.
	addr(c client) netip.Addr
	dialTCP(ctx context.Context, from netip.Addr, to netip.AddrPort) (net.Conn, error)
	listenUDP(from netip.Addr) (*net.UDPConn, error)
}

// loopback: 127.0.0.n. Linux routes all of 127.0.0.0/8 to lo, so an
// unprivileged socket can bind any of them, and the proxy, which keys
// affinity on the client IP, sees distinct clients.
type loopback struct{}

func (loopback) addr(c client) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, byte(c)}) }

func (loopback) dialTCP(ctx context.Context, from netip.Addr, to netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: ioTimeout, KeepAlive: -1}
	return d.DialContext(ctx, "tcp4", to.String())
}

func (loopback) listenUDP(from netip.Addr) (*net.UDPConn, error) {
	return net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)))
}

// request is what curl sends, on a connection of its own.
const request = "GET / HTTP/1.1\r\nHost: demo\r\nUser-Agent: kube-userspace-proxy-demo\r\nConnection: close\r\n\r\n"

// accessTCP makes one HTTP request over a new connection from the address
// from to proxy and returns the backend's answer (its name). The request is
// written by hand, not by net/http's client, so that the connection is
// exactly one and a reset reaches the caller as ECONNRESET, unretried.
func accessTCP(ctx context.Context, cn clientNet, proxy netip.AddrPort, from netip.Addr) (string, error) {
	name, _, err := accessTCPFrom(ctx, cn, proxy, from)
	return name, err
}

// accessTCPFrom is accessTCP that also says which source port the client
// had (for the packet path).
func accessTCPFrom(ctx context.Context, cn clientNet, proxy netip.AddrPort, from netip.Addr) (string, netip.AddrPort, error) {
	name, local, err := exchangeTCP(ctx, cn, proxy, from)
	if err != nil {
		return "", local, fmt.Errorf("from %s: %w", from, err)
	}
	return name, local, nil
}

func exchangeTCP(ctx context.Context, cn clientNet, proxy netip.AddrPort, from netip.Addr) (string, netip.AddrPort, error) {
	c, err := cn.dialTCP(ctx, from, proxy)
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	defer c.Close()
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	name, err := askName(c)
	return name, local, err
}

// askName sends the request on c and returns the backend's name from the
// answer.
func askName(c net.Conn) (string, error) {
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := io.WriteString(c, request); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return "", errors.New("connection closed without an answer")
		}
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	name := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK || name == "" {
		return "", fmt.Errorf("answer %q with no backend name", resp.Status)
	}
	return name, nil
}

// accessUDP sends one datagram from a new socket on from (a new UDP session
// for the proxy) and returns the backend's answer.
func accessUDP(cn clientNet, proxy netip.AddrPort, from netip.Addr) (string, error) {
	c, err := cn.listenUDP(from)
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
func accessMany(ctx context.Context, cn clientNet, proxy netip.AddrPort, from netip.Addr, n int) ([]string, error) {
	out := make([]string, 0, n)
	for range n {
		name, err := accessTCP(ctx, cn, proxy, from)
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
