package netns

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// DialTCP opens a TCP connection from inside the namespace. src may be the
// zero value to let the kernel choose the source address.
func (n *NS) DialTCP(ctx context.Context, src netip.Addr, dst netip.AddrPort) (*net.TCPConn, error) {
	var c net.Conn
	err := n.Do(func() error {
		d := net.Dialer{}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		var err error
		c, err = d.DialContext(ctx, "tcp", dst.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// ListenUDP opens an unconnected UDP socket inside the namespace, bound to
// src (zero value: any address, kernel-chosen port). Unconnected, so the
// reply's source address can be checked with ReadFromUDPAddrPort.
func (n *NS) ListenUDP(src netip.Addr) (*net.UDPConn, error) {
	return n.ListenUDPAt(netip.AddrPortFrom(src, 0))
}

// ListenUDPAt is ListenUDP with a chosen source port as well (port 0: the
// kernel's choice), for tests that need a client to reuse its port.
func (n *NS) ListenUDPAt(src netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := n.Do(func() error {
		laddr := &net.UDPAddr{Port: int(src.Port())}
		if src.Addr().IsValid() {
			laddr.IP = src.Addr().AsSlice()
		}
		var err error
		c, err = net.ListenUDP("udp", laddr)
		return err
	})
	return c, err
}

// ListenTCP opens a TCP listener inside the namespace.
func (n *NS) ListenTCP(addr netip.AddrPort) (*net.TCPListener, error) {
	var l *net.TCPListener
	err := n.Do(func() error {
		var err error
		l, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
		return err
	})
	return l, err
}

// HTTPClient returns a client whose connections are opened inside the
// namespace (for healthz/metrics servers bound to the namespace's loopback).
func (n *NS) HTTPClient(timeout time.Duration) *http.Client {
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, err
			}
			return n.DialTCP(ctx, netip.Addr{}, ap)
		},
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}
