package proxier

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// The default share is a quarter of the connections' ceiling (half its
// descriptors) and follows the open-file limit; a share given is kept
// whatever the limit; -1 is none.
func TestTCPShareOfLimit(t *testing.T) {
	for _, c := range []struct {
		given  int
		nofile uint64
		want   int64
	}{
		{0, 1 << 20, 245760}, // 983,040 below the ceiling
		{0, 20000, 4687},     // 18,750
		{0, 1024, 240},       // 960
		{0, 64, 1},           // no descriptor for connections: still one
		{7, 1 << 20, 7},
		{7, 64, 7},
		{-1, 1 << 20, 0},
	} {
		if got := tcpShare(c.given, c.nofile); got != c.want {
			t.Errorf("tcpShare(%d, %d) = %d, want %d", c.given, c.nofile, got, c.want)
		}
	}
	s := newTCPShares(0)
	s.follow(1024)
	var held atomic.Int64
	for i := range 240 {
		if !s.admit(&held) {
			t.Fatalf("client %d refused under a share of 240", i+1)
		}
	}
	if s.admit(&held) || held.Load() != 240 {
		t.Fatalf("client 241 admitted, or counted when refused (held %d)", held.Load())
	}
	s.follow(20000)
	if !s.admit(&held) {
		t.Fatal("the share did not follow a higher limit")
	}
	none := newTCPShares(-1)
	held.Store(1 << 40)
	if !none.admit(&held) {
		t.Fatal("refused with no share")
	}
}

// A proxy socket holding its share of connections resets a new client at
// accept, counted as failed and at the share, no endpoint blamed; the
// connections it holds go on, and one that ends (or a client that fails)
// makes room again. Both data paths, and a faulted connection, which the
// event loops hand to the goroutine relay.
func TestTCPShareRefusesPastIt(t *testing.T) {
	for _, path := range DataPaths {
		for _, faulted := range []bool{false, true} {
			name := path
			if faulted {
				name += "/faulted"
			}
			t.Run(name, func(t *testing.T) { testTCPShareRefuses(t, path, faulted) })
		}
	}
}

func testTCPShareRefuses(t *testing.T, path string, faulted bool) {
	backend := echoBackends(t, "127.0.0.2")[0]
	p := newTestProxier(t, Options{DataPath: path, TCPMaxConnectionsPerPort: 2, Faults: faults.NewTable(0, 0, nil)})
	var opts []svcOpt
	if faulted {
		opts = append(opts, withFaults(`[{"type":"latency","attributes":{"latency":1}}]`))
	}
	p.OnServiceAdd(makeService("web", opts...))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend))
	p.OnServiceAdd(makeService("none", withClusterIP("10.96.0.11")))
	p.Sync()
	web, none := proxyAddr(t, p, "default/web:p"), proxyAddr(t, p, "default/none:p")
	held := func(servicePort string) int64 {
		return p.active[p.lbName(servicePort)].socket.(*tcpProxySocket).held.Load()
	}

	// Clients that find no endpoint leave the share: none's share of 2
	// refuses none of 4 for it.
	for i := range 4 {
		if err := firstRead(none); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("client %d of a Service without endpoints: %v, want a reset", i+1, err)
		}
	}
	if m := p.metrics.ports.forPort("default/none:p", false); m.failed.value() != 4 || m.tcpAtShare.value() != 0 {
		t.Fatalf("Service without endpoints: %v failed, %v at the share; want 4 and 0", m.failed.value(), m.tcpAtShare.value())
	}
	waitHeld(t, func() int64 { return held("default/none:p") }, 0)

	served := func() (net.Conn, error) {
		c, err := net.DialTimeout("tcp", web, 2*time.Second)
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, 2)
		if _, err = c.Write([]byte("hi")); err == nil {
			_, err = io.ReadFull(c, got)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		_ = c.SetDeadline(time.Time{})
		return c, nil
	}
	first, err := served()
	if err != nil {
		t.Fatalf("first client: %v", err)
	}
	defer first.Close()
	second, err := served()
	if err != nil {
		t.Fatalf("second client: %v", err)
	}
	defer second.Close()

	if err := firstRead(web); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("third client of a share of 2: %v, want a reset", err)
	}
	m := p.metrics.ports.forPort("default/web:p", false)
	if m.failed.value() != 1 || m.tcpAtShare.value() != 1 || m.tcpAtCeiling.value() != 0 || m.dialFailures.value() != 0 {
		t.Fatalf("failed %v, at the share %v, at the ceiling %v, dial failures %v; want 1, 1, 0, 0",
			m.failed.value(), m.tcpAtShare.value(), m.tcpAtCeiling.value(), m.dialFailures.value())
	}
	// The held connections are not cut.
	_ = second.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := second.Write([]byte("ok")); err != nil {
		t.Fatalf("held client after the refusal: %v", err)
	}
	if _, err := io.ReadFull(second, make([]byte, 2)); err != nil {
		t.Fatalf("held client after the refusal: %v", err)
	}

	// One ends: a new client is served.
	first.Close()
	waitHeld(t, func() int64 { return held("default/web:p") }, 1)
	third, err := served()
	if err != nil {
		t.Fatalf("a client once a held one ended: %v", err)
	}
	third.Close()
}

// waitHeld waits up to 5 s for a socket's count of connections to reach want.
func waitHeld(t *testing.T, held func() int64, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for held() != want {
		if time.Now().After(deadline) {
			t.Fatalf("the socket counts %d connections, want %d", held(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
