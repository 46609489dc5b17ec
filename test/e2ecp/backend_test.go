package e2ecp

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// backend is an in-process server inside the lab's backends namespace that answers every
// request with its name, in the test/tools/wire protocol (one line in, "NAME REMOTE" out),
// over TCP and UDP on the same address. Being in-process, it can stop the way a pod does
// on SIGTERM: stop accepting, let the connections it holds finish.
type backend struct {
	name string
	addr netip.AddrPort

	tcp    *net.TCPListener
	udp    *net.UDPConn
	conns  sync.WaitGroup // TCP connections being answered
	served sync.WaitGroup // the accept and UDP loops
	once   sync.Once

	mu       sync.Mutex
	answered int
}

// startBackend listens on addr inside ns and serves until close (or the end of t).
func startBackend(t testing.TB, ns *netns.NS, name string, addr netip.AddrPort) *backend {
	t.Helper()
	b := &backend{name: name, addr: addr}
	var err error
	if b.tcp, err = ns.ListenTCP(addr); err != nil {
		t.Fatalf("backend %s: %v", name, err)
	}
	if b.udp, err = ns.ListenUDPAt(addr); err != nil {
		b.tcp.Close()
		t.Fatalf("backend %s: %v", name, err)
	}
	b.served.Add(2)
	go b.acceptLoop()
	go b.udpLoop()
	t.Cleanup(b.close)
	return b
}

func (b *backend) acceptLoop() {
	defer b.served.Done()
	for {
		c, err := b.tcp.AcceptTCP()
		if err != nil {
			return // closed
		}
		b.conns.Add(1)
		go b.answerTCP(c)
	}
}

func (b *backend) answerTCP(c *net.TCPConn) {
	defer b.conns.Done()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		return
	}
	if _, err := fmt.Fprintf(c, "%s %s\n", b.name, c.RemoteAddr()); err == nil {
		b.count()
	}
}

func (b *backend) udpLoop() {
	defer b.served.Done()
	buf := make([]byte, 2048)
	for {
		_, from, err := b.udp.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		if _, err := b.udp.WriteToUDPAddrPort([]byte(fmt.Sprintf("%s %s\n", b.name, from)), from); err == nil {
			b.count()
		}
	}
}

func (b *backend) count() {
	b.mu.Lock()
	b.answered++
	b.mu.Unlock()
}

// answers is how many requests the backend has answered so far.
func (b *backend) answers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.answered
}

// close stops accepting (new connections are refused from now on), lets every accepted
// connection be answered, and returns once nothing of the backend runs any more.
func (b *backend) close() {
	b.once.Do(func() {
		b.tcp.Close()
		b.udp.Close()
		b.served.Wait()
		b.conns.Wait()
	})
}
