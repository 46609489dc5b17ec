package demo

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
)

// backend is one "pod" of the demo: a TCP server that writes its name
// and closes each connection, and a UDP server that answers every datagram
// with its name. Both listen on 127.0.0.1 on kernel-chosen ports.
type backend struct {
	name string
	tcp  *net.TCPListener
	udp  *net.UDPConn
	wg   sync.WaitGroup
}

// startBackends starts one backend per name; on error nothing stays open.
func startBackends(names ...string) ([]*backend, error) {
	var out []*backend
	for _, name := range names {
		b, err := startBackend(name)
		if err != nil {
			stopBackends(out)
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func startBackend(name string) (*backend, error) {
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}
	ln, err := net.ListenTCP("tcp4", loopback)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", name, err)
	}
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: loopback.IP})
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("backend %s: %w", name, err)
	}
	b := &backend{name: name, tcp: ln, udp: pc}
	b.wg.Add(2)
	go b.serveTCP()
	go b.serveUDP()
	return b, nil
}

func (b *backend) tcpAddr() netip.AddrPort { return b.tcp.Addr().(*net.TCPAddr).AddrPort() }
func (b *backend) udpAddr() netip.AddrPort { return b.udp.LocalAddr().(*net.UDPAddr).AddrPort() }

func (b *backend) serveTCP() {
	defer b.wg.Done()
	reply := []byte(b.name + "\n")
	for {
		c, err := b.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		// One short write and a close: no goroutine per connection needed.
		_, _ = c.Write(reply)
		_ = c.Close()
	}
}

func (b *backend) serveUDP() {
	defer b.wg.Done()
	reply := []byte(b.name + "\n")
	buf := make([]byte, 2048)
	for {
		_, from, err := b.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_, _ = b.udp.WriteToUDPAddrPort(reply, from)
	}
}

func (b *backend) stop() {
	_ = b.tcp.Close()
	_ = b.udp.Close()
	b.wg.Wait()
}

func stopBackends(bs []*backend) {
	for _, b := range bs {
		b.stop()
	}
}

// backendByTCPAddr maps a TCP endpoint ("127.0.0.1:PORT") back to its name, so
// that tables speak of backend-a rather than of port numbers.
func backendByTCPAddr(bs []*backend, addr string) string {
	for _, b := range bs {
		if b.tcpAddr().String() == addr {
			return b.name
		}
	}
	return addr
}
