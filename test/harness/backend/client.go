package backend

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// Answer is one backend reply, as the client side of Server's protocol
// (AskTCP, AskUDP: send one line, read "NAME REMOTE") reads it.
type Answer struct {
	Backend string // the backend's name
	Remote  string // the peer address the backend saw (for the proxy: the node side)
}

func parse(line string) (Answer, error) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return Answer{}, fmt.Errorf("empty answer")
	}
	a := Answer{Backend: f[0]}
	if len(f) > 1 {
		a.Remote = f[1]
	}
	return a, nil
}

// AskTCP asks over an open connection and closes it.
func AskTCP(c net.Conn, timeout time.Duration) (Answer, error) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("who\n")); err != nil {
		return Answer{}, fmt.Errorf("write: %w", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return Answer{}, fmt.Errorf("read: %w", err)
	}
	return parse(line)
}

// AskUDP sends one datagram from the unconnected socket c to dst and returns
// the answer and the address the answer came from (for a Service, it must be
// the ClusterIP:port the client sent to).
func AskUDP(c *net.UDPConn, dst netip.AddrPort, timeout time.Duration) (Answer, netip.AddrPort, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.WriteToUDPAddrPort([]byte("who\n"), dst); err != nil {
		return Answer{}, netip.AddrPort{}, fmt.Errorf("write: %w", err)
	}
	buf := make([]byte, 2048)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		return Answer{}, netip.AddrPort{}, fmt.Errorf("read: %w", err)
	}
	a, err := parse(string(buf[:n]))
	return a, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), err
}
