package proxier

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// On the event loops an idle proxied connection holds no goroutine: the
// only goroutines the connections add are the echo backend's (one each).
func TestEventLoopIdleConnectionsHoldNoGoroutine(t *testing.T) {
	const conns = 100
	backend := echoBackends(t, "127.0.0.2")[0]
	p := newTestProxier(t, Options{DataPath: DataPathEventLoop})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend))
	p.Sync()
	addr := proxyAddr(t, p, "default/web:p")
	dialExchange(t, addr) // the loops and the port are warm
	before := runtime.NumGoroutine()
	for range conns {
		dialExchange(t, addr)
	}
	time.Sleep(50 * time.Millisecond)
	added := runtime.NumGoroutine() - before
	if added > conns+conns/10 {
		t.Fatalf("%d idle connections added %d goroutines; want about %d (the echo backend's)", conns, added, conns)
	}
	live := waitConnections(t, p, "all connections listed", func(c []DebugConnection) bool { return len(c) == conns+1 })
	for _, c := range live {
		if c.BytesFromClient != 2 || c.BytesFromBackend != 2 {
			t.Fatalf("connection %+v: want 2 bytes each way", c)
		}
	}
}

// A connection that draws a fault leaves the event loop for the goroutine
// relay, which applies it.
// On the event loops an idle service port holds no goroutine either: the
// loops accept, and its Serve returns at once. Its Serve goroutine used to
// wait for Close, 3.6-3.8 KiB of stack per port
// (BenchmarkIdleServicePorts/TCP-eventloop).
func TestEventLoopServicePortsHoldNoGoroutine(t *testing.T) {
	const ports = 50
	p := newTestProxier(t, Options{DataPath: DataPathEventLoop})
	p.OnServiceAdd(makeService("warm"))
	p.Sync() // the loops are started
	time.Sleep(50 * time.Millisecond)
	before := runtime.NumGoroutine()
	for i := range ports {
		p.OnServiceAdd(makeService(fmt.Sprintf("web-%d", i), withClusterIP(fmt.Sprintf("10.96.1.%d", i+1))))
	}
	p.Sync()
	if n := len(p.DebugServices()); n != ports+1 {
		t.Fatalf("%d service ports open, want %d", n, ports+1)
	}
	time.Sleep(50 * time.Millisecond)
	if added := runtime.NumGoroutine() - before; added > 5 {
		t.Errorf("%d idle service ports added %d goroutines, want none of their own", ports, added)
	}
}

func TestEventLoopFaultedConnectionGetsItsFault(t *testing.T) {
	accepted := make(chan struct{}, 10)
	ln := serveTCP(t, "127.0.0.2", func(c net.Conn) { accepted <- struct{}{} })
	p := newTestProxier(t, Options{DataPath: DataPathEventLoop})
	p.OnServiceAdd(makeService("web", withFaults(`[{"type":"refuse"}]`)))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, ln.Addr().String()))
	p.Sync()
	c, err := net.DialTimeout("tcp", proxyAddr(t, p, "default/web:p"), 2*time.Second)
	if err == nil {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if !isConnReset(err) {
		t.Fatalf("refused connection: %v, want a reset", err)
	}
	select {
	case <-accepted:
		t.Fatal("a refused connection reached the backend")
	case <-time.After(50 * time.Millisecond):
	}
}

// With the fault API on every connection is tracked, so that a port set
// down can cut it; one without a fault stays on the event loops, and the
// cut still resets it there.
func TestEventLoopTrackedConnectionIsCutByDown(t *testing.T) {
	const conns = 20
	_, table, addr := faultedWeb(t, DataPathEventLoop)
	dialExchange(t, addr)
	before := runtime.NumGoroutine()
	var clients []*net.TCPConn
	for range conns {
		clients = append(clients, dialExchange(t, addr))
	}
	time.Sleep(50 * time.Millisecond)
	if added := runtime.NumGoroutine() - before; added > conns+conns/2 {
		t.Fatalf("%d tracked connections added %d goroutines: they left the event loops", conns, added)
	}
	if _, err := table.SetEnabled("default.web.p", false); err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !isConnReset(err) {
			t.Fatalf("connection %d after the port went down: %v, want a reset", i, err)
		}
	}
}

// A client the loops held when they stopped (the proxy shutting down) is
// not counted or reported as a failed connection: no endpoint was tried.
func TestEventLoopShutdownIsNoFailure(t *testing.T) {
	s := &tcpProxySocket{failed: new(counter), label: "default/web:http"}
	(&loopClient{s: s}).Failed(relay.ErrLoopStopped)
	if n := s.failed.value(); n != 0 {
		t.Errorf("connections_failed counted %v for a shutdown", n)
	}
	(&loopClient{s: s}).Failed(errors.New("connection refused"))
	if n := s.failed.value(); n != 1 {
		t.Errorf("connections_failed %v after a real failure, want 1", n)
	}
}
