package proxier

import (
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// echoServer copies every connection back to itself.
func echoServer(t *testing.T, ip string) net.Listener {
	return serveTCP(t, ip, func(c net.Conn) {
		// Plain reads and writes: Go's own splice would hold a pipe per
		// connection and blur the descriptor count.
		io.Copy(struct{ io.Writer }{c}, struct{ io.Reader }{c})
		c.(*net.TCPConn).CloseWrite()
	})
}

// A bulk transfer both ways at once arrives intact: 16 MiB of random bytes
// sent while the echo comes back, checked by hash.
func TestSpliceBulkIntegrity(t *testing.T) {
	ln := echoServer(t, "127.0.0.2")
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("echo"))
	p.OnEndpointSliceAdd(makeSlice("echo", v1.ProtocolTCP, ln.Addr().String()))
	p.Sync()
	c, err := net.Dial("tcp", proxyAddr(t, p, "default/echo:p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))

	data := make([]byte, 16<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	sent := sha256.Sum256(data)
	go func() {
		// Uneven writes exercise partial splices.
		for off := 0; off < len(data); {
			n := min(len(data)-off, 1+r.IntN(200_000))
			if _, err := c.Write(data[off : off+n]); err != nil {
				return
			}
			off += n
		}
		c.(*net.TCPConn).CloseWrite()
	}()
	h := sha256.New()
	n, err := io.Copy(h, c)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("echoed %d bytes, err %v; want %d", n, err, len(data))
	}
	var got [32]byte
	copy(got[:], h.Sum(nil))
	if got != sent {
		t.Fatal("echoed bytes differ from those sent")
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// An idle proxied connection holds its two sockets and no pipe: this is
// what lets 10,000 idle connections fit under a 20,000 descriptor limit.
func TestIdleConnectionHoldsNoPipe(t *testing.T) {
	ln := echoServer(t, "127.0.0.2")
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("echo"))
	p.OnEndpointSliceAdd(makeSlice("echo", v1.ProtocolTCP, ln.Addr().String()))
	p.Sync()
	addr := proxyAddr(t, p, "default/echo:p")

	const conns = 50
	before := openFDs(t)
	var clients []net.Conn
	for range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		// One round trip so both directions have moved bytes.
		c.Write([]byte("x"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	// Per connection this process holds: client, echo server side, and the
	// proxy's two sockets. Pooled pipes are bounded and shared, not per
	// connection.
	perConn := float64(openFDs(t)-before) / conns
	if perConn > 4.5 {
		t.Fatalf("%.1f descriptors per idle proxied connection (test process incl. client and server), want 4", perConn)
	}
}
