package proxier

import (
	"bytes"
	"math"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// startUDPEcho answers each datagram with prefix + the datagram.
func startUDPEcho(t *testing.T, addr, prefix string) *net.UDPConn {
	t.Helper()
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, maxDatagram)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			pc.WriteToUDPAddrPort(append([]byte(prefix), buf[:n]...), from)
		}
	}()
	return pc
}

func TestUDPRelay(t *testing.T) {
	a := startUDPEcho(t, "127.0.0.2:0", "a:")
	port := a.LocalAddr().(*net.UDPAddr).Port
	startUDPEcho(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), uint16(port)).String(), "b:")

	p := newTestProxier(t, Options{UDPIdleTimeout: 200 * time.Millisecond})
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, a.LocalAddr().String(), "127.0.0.3:"+portOf(a.LocalAddr())))
	p.Sync()
	proxy := proxyAddr(t, p, "default/dns:p")
	proxyAP := netip.MustParseAddrPort(proxy)

	exchange := func(c *net.UDPConn, payload []byte) (string, netip.AddrPort) {
		t.Helper()
		if _, err := c.Write(payload); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, maxDatagram+10)
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("no reply: %v", err)
		}
		return string(buf[:n]), from
	}

	// One client keeps its backend for the whole session; replies come
	// from the address the client sent to.
	c1, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(proxyAP))
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	first, from := exchange(c1, []byte("x"))
	if from.Port() != proxyAP.Port() {
		t.Fatalf("reply from %v, want the proxy address %v", from, proxyAP)
	}
	for range 5 {
		if got, _ := exchange(c1, []byte("x")); got != first {
			t.Fatalf("session moved from %q to %q within the idle timeout", first, got)
		}
	}

	// A second client ip:port is a new session: round robin moves it on.
	c2, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(proxyAP))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, _ := exchange(c2, []byte("x")); got == first {
		t.Fatalf("second session got the same backend %q; want the next one", got)
	}

	// 64 KiB-class datagrams pass whole (the legacy 4 KiB buffer truncated).
	big := bytes.Repeat([]byte("z"), 60000)
	got, _ := exchange(c1, big)
	if len(got) != len(big)+2 {
		t.Fatalf("large datagram came back with %d bytes, want %d", len(got), len(big)+2)
	}

	// Idle sessions expire: after the timeout the session table empties.
	deadline := time.Now().Add(3 * time.Second)
	for {
		sock := p.active[p.lbName("default/dns:p")].socket.(*udpProxySocket)
		sock.mu.Lock()
		n := sock.sessions.len()
		sock.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d UDP sessions still open long after the idle timeout", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dialUDPBackend connects to IPv4, IPv6 and IPv4-mapped backends. An IPv6
// backend used to panic the whole proxy (As4 of an IPv6 address) at the
// first datagram of a session.
func TestDialUDPBackendFamilies(t *testing.T) {
	for _, tt := range []struct{ listen, dial string }{
		{"127.0.0.1", "127.0.0.1"},
		{"::1", "::1"},
		{"127.0.0.1", "::ffff:127.0.0.1"},
	} {
		t.Run(tt.dial, func(t *testing.T) {
			pc, err := net.ListenPacket("udp", net.JoinHostPort(tt.listen, "0"))
			if err != nil {
				t.Skipf("no %s: %v", tt.listen, err)
			}
			defer pc.Close()
			port := pc.LocalAddr().(*net.UDPAddr).Port
			fd, err := dialUDPBackend(netip.AddrPortFrom(netip.MustParseAddr(tt.dial), uint16(port)))
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			if _, err := unix.Write(fd, []byte("hi")); err != nil {
				t.Fatal(err)
			}
			pc.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 8)
			if n, _, err := pc.ReadFrom(buf); err != nil || string(buf[:n]) != "hi" {
				t.Fatalf("backend read %q, %v", buf[:n], err)
			}
		})
	}
}

// A new session's backend socket costs no allocation: its address is
// encoded on the stack (the sockaddrs of unix.Connect were two per session,
// one of them an IPv6 one made for every endpoint and dropped for IPv4).
func TestDialUDPBackendAllocatesNothing(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1"} {
		t.Run(host, func(t *testing.T) {
			pc, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
			if err != nil {
				t.Skipf("no %s: %v", host, err)
			}
			defer pc.Close()
			ep := pc.LocalAddr().(*net.UDPAddr).AddrPort()
			var dialErr error
			n := testing.AllocsPerRun(100, func() {
				fd, err := dialUDPBackend(ep)
				if err != nil {
					dialErr = err
					return
				}
				unix.Close(fd)
			})
			if dialErr != nil {
				t.Fatal(dialErr)
			}
			if n != 0 {
				t.Fatalf("dialUDPBackend: %v allocations, want 0", n)
			}
		})
	}
}

// Empty datagrams pass both ways, as a session's first and later on
// (keep-alives and probes of some protocols are empty).
func TestUDPRelaysEmptyDatagrams(t *testing.T) {
	a := startUDPEcho(t, "127.0.0.2:0", "")
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("keepalive", withProtocol(v1.ProtocolUDP)))
	p.OnEndpointSliceAdd(makeSlice("keepalive", v1.ProtocolUDP, a.LocalAddr().String()))
	p.Sync()
	proxyAP := netip.MustParseAddrPort(proxyAddr(t, p, "default/keepalive:p"))
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(proxyAP))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 16)
	for i, payload := range []string{"", "x", ""} {
		if _, err := c.Write([]byte(payload)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, err := c.Read(buf)
		if err != nil || string(buf[:n]) != payload {
			t.Fatalf("datagram %d (%q): echoed %q, %v", i, payload, buf[:n], err)
		}
	}
}

// A UDP endpoint that refuses a session's datagrams (ICMP port
// unreachable) ends the session and counts as the endpoint's failure, as a
// refused TCP dial does: it ended in no counter and no log line, so UDP to
// a dead endpoint was invisible (metrics/config audit).
func TestUDPRefusedEndpointCounts(t *testing.T) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := pc.LocalAddr().String()
	pc.Close() // nothing listens there now: the kernel answers ICMP port unreachable
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, closed))
	p.Sync()
	c, err := net.Dial("udp", proxyAddr(t, p, "default/dns:p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := p.metrics.ports.lookup("default/dns:p")
	waitFor(t, "the refusal counted", func() bool {
		_, _ = c.Write([]byte("q")) // the refusal shows on the session's next read or write
		time.Sleep(10 * time.Millisecond)
		return m.dialFailures.value() >= 1
	})
	waitFor(t, "the refused session closed", func() bool { return m.udpSessions.value() == 0 })
}

// TestUDPRefusedEndpointRepinsAffinity: under sessionAffinity ClientIP, a
// client pinned to an endpoint that refuses its datagrams (ICMP port
// unreachable) is re-pinned to a live one, as a refused TCP dial re-pins.
// It stayed pinned to the dead endpoint for as long as it kept sending:
// every new session found the pin again and its refreshed last use.
func TestUDPRefusedEndpointRepinsAffinity(t *testing.T) {
	live := startUDPEcho(t, "127.0.0.2:0", "live:")
	port := portOf(live.LocalAddr())
	p := newTestProxier(t, Options{})
	p.lb.KeepOrder() // the dead endpoint first: the client's first pin
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP), func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	}))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, "127.0.0.4:"+port, "127.0.0.2:"+port))
	p.Sync()
	c, err := net.Dial("udp", proxyAddr(t, p, "default/dns:p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	answered := 0
	for try := 0; try < 50 && answered < 5; try++ {
		_, _ = c.Write([]byte("q"))
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := c.Read(buf)
		if err != nil {
			if answered > 0 {
				t.Fatalf("after %d answers the client lost its live endpoint: %v", answered, err)
			}
			continue
		}
		if got := string(buf[:n]); got != "live:q" {
			t.Fatalf("answer %q, want live:q", got)
		}
		answered++
	}
	if answered < 5 {
		t.Fatalf("%d answers in 50 tries: the client stayed pinned to the endpoint that refuses", answered)
	}
}

// A --udp-timeout as large as a duration goes (2562047h47m16.854775807s,
// a natural way to say "never") keeps sessions open: the session's expiry
// (its last datagram's mono.Now plus the timeout) wrapped into the past,
// every session closed as it opened and a reply that took a moment was
// lost. (2562047h wraps alike once the process has run 47 minutes.)
func TestUDPHugeTimeoutKeepsSessions(t *testing.T) {
	be, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := be.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond) // a backend that takes a moment
			_, _ = be.WriteToUDPAddrPort(append([]byte("re:"), buf[:n]...), from)
		}
	}()
	never := time.Duration(math.MaxInt64)
	p := newTestProxier(t, Options{UDPIdleTimeout: never})
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, be.LocalAddr().String()))
	p.Sync()
	c, err := net.Dial("udp", proxyAddr(t, p, "default/dns:p"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "re:q" {
		t.Fatalf("reply %q, %v; want \"re:q\" (the session was closed before it came)", buf[:n], err)
	}
}

// lateStart is a proxy socket whose loop starts only when the test says.
type lateStart struct{ proxySocket }

func (lateStart) Start() {}

// A UDP port closed before its goroutine started (a Service added and
// removed at once, on a loaded node) is not an error: Serve finds the
// socket closed and returns without logging it "unusable" (ERROR, "use of
// closed network connection").
func TestUDPPortClosedBeforeServeLogsNoError(t *testing.T) {
	logs := captureKlog(t)
	p := newTestProxier(t, Options{})
	var sock proxySocket
	listen := p.listen
	p.listen = func(name loadbalancer.ServicePortName, bind netip.Addr, port int, needIPv6 bool, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) (proxySocket, error) {
		s, err := listen(name, bind, port, needIPv6, sp, fp, cfg)
		sock = s
		return lateStart{s}, err
	}
	svc := makeService("dns", withProtocol(v1.ProtocolUDP))
	p.OnServiceAdd(svc)
	p.Sync()
	p.OnServiceDelete(svc)
	p.Sync()
	udp, ok := sock.(*udpProxySocket)
	if !ok {
		t.Fatalf("the port's socket is %T, want *udpProxySocket", sock)
	}
	udp.Serve() // as its goroutine, started late, runs
	klog.Flush()
	if out := logs.String(); strings.Contains(out, "UDP service socket unusable") {
		t.Errorf("a port closed before its loop started was logged unusable:\n%s", out)
	}
}

// A UDP session whose endpoint cannot be dialled (here the broadcast
// address, which connect refuses without SO_BROADCAST) is opened on
// another endpoint, past the one that failed: under ClientIP affinity the
// client's pin moves with it. Counted as the endpoint's dial failure.
func TestUDPDialFailureMovesTheClientOn(t *testing.T) {
	live := startUDPEcho(t, "127.0.0.2:0", "live:")
	port := portOf(live.LocalAddr())
	p := newTestProxier(t, Options{})
	p.lb.KeepOrder() // the endpoint that cannot be dialled first: the client's first pin
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP), func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	}))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, "255.255.255.255:"+port, "127.0.0.2:"+port))
	p.Sync()
	c, err := net.Dial("udp", proxyAddr(t, p, "default/dns:p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("the client's first datagram was not answered (%v): its session was not opened on the live endpoint", err)
	}
	if got := string(buf[:n]); got != "live:q" {
		t.Fatalf("answer %q, want live:q", got)
	}
	if got := p.metrics.ports.lookup("default/dns:p").dialFailures.value(); got != 1 {
		t.Errorf("dial failures %v, want 1", got)
	}
}
