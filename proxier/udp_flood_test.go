package proxier

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// loopbackSource is the i-th distinct client address on lo (127.10.x.y;
// the whole of 127/8 is local on Linux).
func loopbackSource(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{127, 10, byte(i / 250), byte(i%250 + 1)})
}

// oneDatagramClients sends one datagram from each of n distinct loopback
// sources to addr and waits for its reply, as DNS clients with a fresh
// source per query do. It returns how many got a reply.
func oneDatagramClients(t *testing.T, addr netip.AddrPort, first, n int) int {
	t.Helper()
	answered := 0
	buf := make([]byte, 64)
	for i := first; i < first+n; i++ {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopbackSource(i), 0)), net.UDPAddrFromAddrPort(addr))
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("q")); err == nil {
			if _, err := c.Read(buf); err == nil {
				answered++
			}
		}
		c.Close()
	}
	return answered
}

// processCost is what the process holds: descriptors, goroutines and the
// Go memory (heap objects and goroutine stacks) after a collection.
type processCost struct {
	fds, goroutines int
	bytes           uint64
}

func measureProcess(t *testing.T) processCost {
	t.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return processCost{fds: len(fds), goroutines: runtime.NumGoroutine(), bytes: ms.HeapAlloc + ms.StackInuse}
}

// udpSessions is how many client sessions the service port's socket holds.
func udpSessions(p *Proxier, servicePort string) int {
	p.syncMu.Lock()
	sock := p.active[p.lbName(servicePort)].socket.(*udpProxySocket)
	p.syncMu.Unlock()
	sock.mu.Lock()
	defer sock.mu.Unlock()
	return sock.sessions.len()
}

// Thousands of one-datagram clients cost one descriptor and a few hundred
// bytes each, no goroutine: before, each held a connected socket, a
// goroutine and a 64 KiB buffer on its stack (2,000 clients: 183 MiB).
func TestUDPSessionCostIsBounded(t *testing.T) {
	const clients = 3000
	echo := startUDPEcho(t, "127.0.0.2:0", "")
	// Caps within the descriptor share, so that they are not scaled down
	// below the clients (udpCaps).
	p := newTestProxier(t, Options{UDPIdleTimeout: time.Minute, UDPMaxSessions: 2 * clients, UDPMaxSessionsPerPort: 2 * clients})
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, echo.LocalAddr().String()))
	p.Sync()
	addr := netip.MustParseAddrPort(proxyAddr(t, p, "default/dns:p"))

	// One client first, so that lazily built state is not counted.
	oneDatagramClients(t, addr, clients, 1)
	before := measureProcess(t)
	if got := oneDatagramClients(t, addr, 0, clients); got < clients*99/100 {
		t.Fatalf("%d of %d clients got a reply", got, clients)
	}
	after := measureProcess(t)
	sessions := udpSessions(p, "default/dns:p") - 1
	if sessions < clients*99/100 {
		t.Fatalf("%d sessions live after %d clients with a 1 min idle timeout", sessions, clients)
	}
	perSession := float64(int64(after.bytes)-int64(before.bytes)) / float64(sessions)
	t.Logf("%d sessions: +%d descriptors, +%d goroutines, +%d KiB Go memory (%.0f B per session)",
		sessions, after.fds-before.fds, after.goroutines-before.goroutines,
		(int64(after.bytes)-int64(before.bytes))/1024, perSession)
	if d := after.fds - before.fds; d > sessions+16 {
		t.Errorf("%d descriptors more for %d sessions: want at most one each", d, sessions)
	}
	if d := after.goroutines - before.goroutines; d > 16 {
		t.Errorf("%d goroutines more for %d sessions: want none per session", d, sessions)
	}
	if perSession > 2048 {
		t.Errorf("%.0f bytes of Go memory per session, want at most 2 KiB", perSession)
	}
}

// udpClients are client sockets on distinct loopback sources that stay
// open, so each keeps its ip:port (its session) across datagrams.
type udpClients struct {
	t     *testing.T
	to    netip.AddrPort
	conns map[int]*net.UDPConn
}

func newUDPClients(t *testing.T, to netip.AddrPort) *udpClients {
	c := &udpClients{t: t, to: to, conns: map[int]*net.UDPConn{}}
	t.Cleanup(func() {
		for _, conn := range c.conns {
			conn.Close()
		}
	})
	return c
}

// ask sends one datagram from source i and reports whether a reply came.
func (c *udpClients) ask(i int) bool {
	c.t.Helper()
	conn := c.conns[i]
	if conn == nil {
		var err error
		conn, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopbackSource(i), 0)), net.UDPAddrFromAddrPort(c.to))
		if err != nil {
			c.t.Fatalf("client %d: %v", i, err)
		}
		c.conns[i] = conn
	}
	if _, err := conn.Write([]byte("q")); err != nil {
		c.t.Fatalf("client %d: %v", i, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	_, err := conn.Read(make([]byte, 16))
	return err == nil
}

func (c *udpClients) askAll(from, to int) {
	c.t.Helper()
	for i := from; i < to; i++ {
		if !c.ask(i) {
			c.t.Fatalf("client %d got no reply", i)
		}
	}
}

// sessionSources lists the client sources holding a session on servicePort.
func sessionSources(p *Proxier, servicePort string) map[netip.Addr]bool {
	p.syncMu.Lock()
	sock := p.active[p.lbName(servicePort)].socket.(*udpProxySocket)
	p.syncMu.Unlock()
	sock.mu.Lock()
	defer sock.mu.Unlock()
	out := map[netip.Addr]bool{}
	sock.sessions.each(func(s *udpSession) { out[s.client.Addr()] = true })
	return out
}

// At a port's cap the oldest idle session makes room; at the total cap the
// port holding the most sessions gives up its oldest idle one, a port its
// own only when no other holds more. Every eviction is counted.
func TestUDPSessionCaps(t *testing.T) {
	echo := startUDPEcho(t, "127.0.0.2:0", "")
	p := newTestProxier(t, Options{UDPIdleTimeout: time.Minute, UDPMaxSessionsPerPort: 50, UDPMaxSessions: 70})
	addrs := map[string]netip.AddrPort{}
	for i, name := range []string{"a", "b", "c"} {
		p.OnServiceAdd(makeService(name, withProtocol(v1.ProtocolUDP), withClusterIP(fmt.Sprintf("10.96.0.%d", 10+i))))
		p.OnEndpointSliceAdd(makeSlice(name, v1.ProtocolUDP, echo.LocalAddr().String()))
	}
	p.Sync()
	for _, name := range []string{"a", "b", "c"} {
		addrs[name] = netip.MustParseAddrPort(proxyAddr(t, p, "default/"+name+":p"))
	}
	limit := func(port, action string) int {
		m := p.metrics.ports.lookup("default/" + port + ":p")
		if action == "evicted" {
			return int(m.udpEvicted.value())
		}
		return int(m.udpDropped.value())
	}
	live := func(port string) int {
		return int(p.metrics.ports.lookup("default/" + port + ":p").udpSessions.value())
	}

	a := newUDPClients(t, addrs["a"])
	a.askAll(0, 50) // the port is full
	a.ask(0)        // 0 is active again: 1 is now the oldest idle
	a.askAll(50, 52)
	got := sessionSources(p, "default/a:p")
	if len(got) != 50 || !got[loopbackSource(0)] || got[loopbackSource(1)] || got[loopbackSource(2)] || !got[loopbackSource(51)] {
		t.Fatalf("port a after 52 clients at a cap of 50: %d sessions (0: %v, 1: %v, 2: %v, 51: %v); want 50, the idle 1 and 2 evicted, the active 0 kept",
			len(got), got[loopbackSource(0)], got[loopbackSource(1)], got[loopbackSource(2)], got[loopbackSource(51)])
	}
	if limit("a", "evicted") != 2 || live("a") != 50 {
		t.Fatalf("port a: %d evictions counted, gauge %d; want 2 and 50", limit("a", "evicted"), live("a"))
	}

	// Port b meets the total cap (70) after 20 sessions; a, holding more,
	// gives up its oldest idle sessions for b's clients until the two
	// hold as many, and b then recycles its own. (b's own first, as
	// before, closed its few clients' sessions, replies on the way, for
	// each other while a kept 50.)
	b := newUDPClients(t, addrs["b"])
	b.askAll(100, 130)
	if n := len(sessionSources(p, "default/b:p")); n != 30 || limit("b", "evicted") != 0 || live("b") != 30 {
		t.Fatalf("port b: %d sessions, %d evictions, gauge %d; want 30, 0, 30: a, holding more, gives up its own", n, limit("b", "evicted"), live("b"))
	}
	if n := len(sessionSources(p, "default/a:p")); n != 40 || limit("a", "evicted") != 12 || live("a") != 40 {
		t.Fatalf("port a: %d sessions, %d evictions, gauge %d; want 40, 12, 40", n, limit("a", "evicted"), live("a"))
	}
	b.askAll(130, 140)
	if na, nb := len(sessionSources(p, "default/a:p")), len(sessionSources(p, "default/b:p")); na != 35 || nb != 35 || limit("b", "evicted") != 5 {
		t.Fatalf("ports a and b: %d and %d sessions, b evicted %d of its own; want 35, 35, 5", na, nb, limit("b", "evicted"))
	}

	// Port c has nothing to give up: a port holding the most gives up its
	// oldest idle session for c's client.
	c := newUDPClients(t, addrs["c"])
	if !c.ask(200) {
		t.Fatal("a client of port c got no reply at the total cap: no other port gave up a session")
	}
	na, nb := len(sessionSources(p, "default/a:p")), len(sessionSources(p, "default/b:p"))
	if na+nb != 69 || limit("c", "dropped") != 0 || live("c") != 1 {
		t.Fatalf("ports a and b: %d and %d sessions; port c: %d drops, gauge %d; want 69 together, 0, 1",
			na, nb, limit("c", "dropped"), live("c"))
	}
	if used := p.sockCfg.udpBudget.used.Load(); used != 70 {
		t.Fatalf("budget used %d, want 70", used)
	}
}

// At the total cap a port with no session of its own to give up takes one
// from the port holding the most: with --udp-max-sessions=4, four clients
// of one Service held every session and the other Service's first client
// was dropped until they idled out.
func TestUDPSessionCapsEvictAcrossPorts(t *testing.T) {
	echo := startUDPEcho(t, "127.0.0.2:0", "")
	p := newTestProxier(t, Options{UDPIdleTimeout: time.Minute, UDPMaxSessions: 4})
	for i, name := range []string{"a", "b"} {
		p.OnServiceAdd(makeService(name, withProtocol(v1.ProtocolUDP), withClusterIP(fmt.Sprintf("10.96.0.%d", 10+i))))
		p.OnEndpointSliceAdd(makeSlice(name, v1.ProtocolUDP, echo.LocalAddr().String()))
	}
	p.Sync()
	a := newUDPClients(t, netip.MustParseAddrPort(proxyAddr(t, p, "default/a:p")))
	b := newUDPClients(t, netip.MustParseAddrPort(proxyAddr(t, p, "default/b:p")))
	a.askAll(0, 4) // every session of the proxy
	a.ask(0)       // 0 is active again: 1 is now a's oldest idle
	if !b.ask(10) {
		t.Fatal("port b's first client got no reply: port a holds every session and gave up none")
	}
	m := func(port string) *portMetrics { return p.metrics.ports.lookup("default/" + port + ":p") }
	got := sessionSources(p, "default/a:p")
	if len(got) != 3 || got[loopbackSource(1)] || !got[loopbackSource(0)] {
		t.Fatalf("port a: %d sessions (0: %v, 1: %v); want 3, its oldest idle (1) given up", len(got), got[loopbackSource(0)], got[loopbackSource(1)])
	}
	if ev, dr := m("a").udpEvicted.value(), m("b").udpDropped.value(); ev != 1 || dr != 0 {
		t.Fatalf("port a evicted %v, port b dropped %v; want 1 and 0", ev, dr)
	}
	if used := p.sockCfg.udpBudget.used.Load(); used != 4 {
		t.Fatalf("budget used %d, want 4", used)
	}
	// Both Services keep serving their clients.
	a.askAll(0, 1)
	b.askAll(10, 11)
}
