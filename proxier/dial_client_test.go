package proxier

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// A client that resets while its backend is being dialled is gone: the
// dial is abandoned at once, both descriptors freed, no endpoint blamed
// (no dial failure, no retry, so no affinity moved) and no failed
// connection counted, only an abandoned one. Both data paths kept both
// sockets until the attempt's end (here 10 s), then counted the
// connection failed and the attempt a dial failure.
func TestClientResetWhileDialingAbandonsTheDial(t *testing.T) {
	for _, dp := range DataPaths {
		t.Run(dp, func(t *testing.T) {
			port := portOf(serveTCP(t, "127.0.0.2", func(net.Conn) {}).Addr())
			silentListener(t, "127.0.0.6", port)
			p := newTestProxier(t, Options{DataPath: dp, DialTimeouts: []time.Duration{10 * time.Second, 10 * time.Second}})
			p.OnServiceAdd(makeService("web", withClientIPAffinity(60)))
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "127.0.0.6:"+port))
			p.Sync()
			addr := proxyAddr(t, p, "default/web:p")
			before := socketsNow(t)
			const clients = 5
			var conns []*net.TCPConn
			for range clients {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c.(*net.TCPConn))
			}
			// Ours, and the proxy's client and backend socket of each:
			// every dial is pending.
			waitNewSockets(t, before, func(n int) bool { return n >= 3*clients }, strconv.Itoa(3*clients)+": every client's dial pending")
			for _, c := range conns {
				_ = c.SetLinger(0)
				c.Close()
			}
			waitNewSockets(t, before, func(n int) bool { return n == 0 }, "none: the proxy's sockets of clients that reset closed")
			m := p.metrics.ports.lookup("default/web:p")
			waitFor(t, strconv.Itoa(clients)+" connections counted abandoned", func() bool { return m.abandoned.value() == clients })
			if f, d, r := m.failed.value(), m.dialFailures.value(), m.dialRetries.value(); f != 0 || d != 0 || r != 0 {
				t.Fatalf("failed %v, dial failures %v, retries %v; want none: the clients left, no endpoint failed", f, d, r)
			}
		})
	}
}

// A client that sends its request and half-closes (FIN, still reading:
// an HTTP/1.0 style client) while its dial is pending is not gone: the
// dial goes on, to the next endpoint past a silent one, and the request
// and the FIN are delivered, the answer read back.
func TestClientHalfCloseWhileDialingIsServed(t *testing.T) {
	for _, dp := range DataPaths {
		t.Run(dp, func(t *testing.T) {
			live := serveTCP(t, "127.0.0.2", func(c net.Conn) {
				got, _ := io.ReadAll(c)
				_, _ = io.WriteString(c, "got "+string(got))
			})
			port := portOf(live.Addr())
			silentListener(t, "127.0.0.6", port)
			p := newTestProxier(t, Options{DataPath: dp, DialTimeouts: []time.Duration{300 * time.Millisecond, 5 * time.Second}})
			p.OnServiceAdd(makeService("web"))
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "127.0.0.6:"+port, "127.0.0.2:"+port))
			p.Sync()
			addr := proxyAddr(t, p, "default/web:p")
			// Round robin: half of them dial the silent endpoint first.
			for i := range 4 {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				tc := c.(*net.TCPConn)
				if _, err := io.WriteString(tc, "request"); err != nil {
					t.Fatal(err)
				}
				_ = tc.CloseWrite()
				_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
				got, err := io.ReadAll(tc)
				tc.Close()
				if string(got) != "got request" || err != nil {
					t.Fatalf("client %d read %q, %v; want %q, then a FIN", i, got, err, "got request")
				}
			}
			m := p.metrics.ports.lookup("default/web:p")
			if d, a := m.dialFailures.value(), m.abandoned.value(); d < 1 || a != 0 {
				t.Fatalf("dial failures %v, abandoned %v; want the silent endpoint's timeouts and nothing abandoned", d, a)
			}
		})
	}
}

// socketsNow are the sockets the process holds (their /proc/self/fd
// links, "socket:[inode]").
func socketsNow(t *testing.T) map[string]bool {
	t.Helper()
	dir := "/proc/self/fd/"
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	sockets := map[string]bool{}
	for _, e := range entries {
		if link, err := os.Readlink(dir + e.Name()); err == nil && strings.HasPrefix(link, "socket:") {
			sockets[link] = true
		}
	}
	return sockets
}

// waitNewSockets polls the sockets opened since before (other tests'
// sockets that close meanwhile do not count) until ok says yes (within
// 3 s).
func waitNewSockets(t *testing.T, before map[string]bool, ok func(n int) bool, what string) {
	t.Helper()
	for end := time.Now().Add(3 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n := 0
		for s := range socketsNow(t) {
			if !before[s] {
				n++
			}
		}
		if ok(n) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d sockets opened since the start still open after 3 s; want %s", n, what)
		}
	}
}

// A goroutine-relayed client whose dial is pending when the proxy stops is
// reset by the stop, and the pending attempt ends with it: its backend
// socket is closed at once and nothing is counted (TestStopEndsPendingDialsWithoutFailure
// has the rest). The attempt went on to its time (here 10 s), holding
// the backend socket past the stop.
func TestStopEndsThePendingAttempt(t *testing.T) {
	port := portOf(serveTCP(t, "127.0.0.2", func(net.Conn) {}).Addr())
	silentListener(t, "127.0.0.6", port)
	before := socketsNow(t)
	p := New(Options{BindAddress: mustAddr("127.0.0.1"), DataPath: DataPathGoroutines, DialTimeouts: []time.Duration{10 * time.Second}})
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "127.0.0.6:"+port))
	p.Sync()
	m := p.metrics.ports.lookup("default/web:p")
	c, err := net.Dial("tcp", proxyAddr(t, p, "default/web:p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Ours, and the proxy's listener, client and backend socket.
	waitNewSockets(t, before, func(n int) bool { return n >= 4 }, "4: the dial pending")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.Run(ctx)
	waitNewSockets(t, before, func(n int) bool { return n == 1 }, "1: only ours left after the stop")
	if f, d, a := m.failed.value(), m.dialFailures.value(), m.abandoned.value(); f != 0 || d != 0 || a != 0 {
		t.Fatalf("failed %v, dial failures %v, abandoned %v after the stop; want nothing counted", f, d, a)
	}
}

// A client that resets during its connect_delay fault, the injected
// stand-in for a slow connect, left before its backend was reached as
// one that resets during a real dial does: counted abandoned, not failed.
// It was counted nowhere.
func TestClientResetDuringConnectDelayIsAbandoned(t *testing.T) {
	backend := serveTCP(t, "127.0.0.2", func(net.Conn) {})
	p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, nil)})
	p.OnServiceAdd(makeService("web", withFaults(`[{"type":"connect_delay","attributes":{"delay":60000}}]`)))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend.Addr().String()))
	p.Sync()
	c, err := net.Dial("tcp", proxyAddr(t, p, "default/web:p"))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).SetLinger(0)
	c.Close()
	m := p.metrics.ports.lookup("default/web:p")
	waitFor(t, "the client counted abandoned", func() bool { return m.abandoned.value() == 1 })
	if f, d := m.failed.value(), m.dialFailures.value(); f != 0 || d != 0 {
		t.Fatalf("failed %v, dial failures %v; want none", f, d)
	}
}

// A client whose connect_delay the proxy's stop ends (the stop resets the
// pending clients) did not leave on its own: nothing is counted, as for a
// dial the stop ends (TestStopEndsThePendingAttempt).
func TestStopDuringConnectDelayCountsNothing(t *testing.T) {
	backend := serveTCP(t, "127.0.0.2", func(net.Conn) {})
	p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, nil)})
	p.OnServiceAdd(makeService("web", withFaults(`[{"type":"connect_delay","attributes":{"delay":60000}}]`)))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend.Addr().String()))
	p.Sync()
	m := p.metrics.ports.lookup("default/web:p")
	c, err := net.Dial("tcp", proxyAddr(t, p, "default/web:p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pending := func() int {
		n := 0
		p.sockCfg.conns.pending.each(func(*net.TCPConn) { n++ })
		return n
	}
	waitFor(t, "the client pending in its connect_delay", func() bool { return pending() == 1 })
	stopNow(p)
	// Its goroutine is done once it left the pending set.
	waitFor(t, "the client's goroutine ended by the stop", func() bool { return pending() == 0 })
	if f, d, a := m.failed.value(), m.dialFailures.value(), m.abandoned.value(); f != 0 || d != 0 || a != 0 {
		t.Fatalf("failed %v, dial failures %v, abandoned %v after the stop; want nothing counted", f, d, a)
	}
}
