package relay

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// lowCeiling puts the descriptor ceiling at n for the test. Not parallel:
// the ceiling is the process's.
func lowCeiling(t *testing.T, n int) {
	t.Helper()
	old := descriptorCeiling.Load()
	SetDescriptorCeiling(n)
	t.Cleanup(func() { descriptorCeiling.Store(old) })
}

// A client accepted into the descriptor reserve is reset at once and
// reported, never handed a Handler: before, the loops relayed clients
// until accept failed with EMFILE, and the proxy's own servers, rule
// writes and manifests had no descriptor left.
func TestLoopRefusesClientInReserve(t *testing.T) {
	b := newLoopBed(t, LoopOptions{})
	lowCeiling(t, 1)               // every descriptor is the reserve's
	b.next <- newLoopHandler(b.ep) // what a client accepted would get
	// The reset may beat the end of the client's connect.
	c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(b.front))
	if err == nil {
		defer c.Close()
		expectReset(t, c)
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connect: %v, want a reset", err)
	}
	select {
	case err := <-b.refused:
		if !errors.Is(err, ErrDescriptorReserve) || !LocalShortage(err) {
			t.Fatalf("refused with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the refusal was not reported")
	}

	<-b.next // not taken

	// Below the ceiling, a client is served.
	SetDescriptorCeiling(1 << 30)
	h := newLoopHandler(b.ep)
	client, backend := b.connect(t, h, true)
	pass(t, client, backend, "served")
}

// A backend socket opened into the reserve fails the connection at once as
// a local shortage: closed, no endpoint blamed.
func TestLoopBackendSocketInReserve(t *testing.T) {
	b := newLoopBed(t, LoopOptions{DialTimeouts: []time.Duration{time.Second, time.Second}})
	lowCeiling(t, 1<<30)
	newSocket = func(family int) (int, error) {
		fd, err := rawio.Socket(family)
		if err == nil {
			SetDescriptorCeiling(fd) // this one is the first of the reserve
		}
		return fd, err
	}
	t.Cleanup(func() { newSocket = rawio.Socket })
	dialFails, failed := refusedClient(t, b, newLoopHandler(b.ep, b.ep))
	if len(dialFails) != 0 || !errors.Is(failed, ErrDescriptorReserve) {
		t.Fatalf("dial failures %v, failed %v; want none blamed and ErrDescriptorReserve", dialFails, failed)
	}
}

// The goroutine relay's dialers refuse a backend socket in the reserve
// (net closes it); listening sockets are the descriptor budget's, not the
// ceiling's.
func TestDialControlRefusesReserve(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	controls := map[string]*net.Dialer{
		"DialControl":    {Control: DialControl(Liveness{})},
		"BackendControl": {Control: BackendControl(Liveness{})},
	}
	for name, d := range controls {
		t.Run(name, func(t *testing.T) {
			lowCeiling(t, 1)
			c, err := d.Dial("tcp4", ln.Addr().String())
			if err == nil {
				c.Close()
			}
			if !errors.Is(err, ErrDescriptorReserve) || !LocalShortage(err) {
				t.Fatalf("dial in the reserve: %v, want ErrDescriptorReserve", err)
			}
			SetDescriptorCeiling(1 << 30)
			c, err = d.Dial("tcp4", ln.Addr().String())
			if err != nil {
				t.Fatalf("dial below the ceiling: %v", err)
			}
			c.Close()
		})
	}
	lowCeiling(t, 1)
	l, err := (&net.ListenConfig{Control: SocketControl(Liveness{})}).Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	l.Close()
}

func TestConnInReserve(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tt := range []struct {
		ceiling int
		want    bool
	}{{0, false}, {1, true}, {1 << 30, false}} {
		lowCeiling(t, tt.ceiling)
		if got := ConnInReserve(c.(*net.TCPConn)); got != tt.want {
			t.Errorf("ceiling %d: in reserve %v, want %v", tt.ceiling, got, tt.want)
		}
	}
}

// A new splice pipe in the reserve is given back as EMFILE, so the
// connection stays buffered (as when pipe2 finds no descriptor); before, the
// pool's pipes (up to 512 descriptors idle) took from the reserve too.
func TestPipeInReserve(t *testing.T) {
	pool := &pipePool{max: 1}
	lowCeiling(t, 1)
	if pp, err := pool.get(); err != unix.EMFILE || !isPipeShortage(err) {
		pool.put(pp, false)
		t.Fatalf("pipe in the reserve: %v, want EMFILE", err)
	}
	SetDescriptorCeiling(1 << 30)
	pp, err := pool.get()
	if err != nil {
		t.Fatal(err)
	}
	pool.put(pp, false)
}
