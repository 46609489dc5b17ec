package proxier

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// servedUDPPort is a UDP service socket listening on listen, relaying to
// backend, with Serve running; served is closed when Serve returns.
func servedUDPPort(t testing.TB, network string, listen, backend netip.AddrPort) (sock *udpProxySocket, served chan struct{}) {
	t.Helper()
	sock = unservedUDPPort(t, network, listen, backend)
	served = make(chan struct{})
	go func() {
		defer close(served)
		sock.Serve()
	}()
	t.Cleanup(func() {
		sock.Close()
		<-served
	})
	return sock, served
}

// unservedUDPPort is servedUDPPort's socket before Serve: a test drives
// its steps itself, on its own goroutine.
func unservedUDPPort(t testing.TB, network string, listen, backend netip.AddrPort) (sock *udpProxySocket) {
	t.Helper()
	lb := loadbalancer.New(clock.RealClock{}, loadbalancer.Limits{})
	name := loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "dns"}, Port: "p", Protocol: v1.ProtocolUDP}
	sp := lb.ServicePort(name)
	lb.SetEndpoints(name, []loadbalancer.Endpoint{{Addr: backend, Ready: true, Serving: true}})
	conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(listen))
	if err != nil {
		t.Skipf("no %s socket on %v: %v", network, listen, err)
	}
	cfg := &socketConfig{
		dialTimeouts: defaultDialTimeouts, udpIdleTimeout: time.Minute, metrics: NewMetrics(),
		udpMaxSessionsPerPort: 16, udpBudget: newUDPBudget(16),
	}
	if sock, err = newUDPProxySocket(name, conn, sp, nil, cfg); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { sock.Close() })
	return sock
}

// The largest datagram UDP carries (65,507 bytes over IPv4, 65,527 over
// IPv6) crosses the proxy whole both ways, byte for byte.
func TestUDPMaximalDatagramRelayedIntact(t *testing.T) {
	for _, tc := range []struct {
		network, loopback string
		size              int
	}{
		{"udp4", "127.0.0.1", 65507},
		{"udp6", "::1", 65527},
	} {
		t.Run(tc.network, func(t *testing.T) {
			lo := netip.MustParseAddr(tc.loopback)
			echo, err := net.ListenUDP(tc.network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo, 0)))
			if err != nil {
				t.Skipf("no %s loopback: %v", tc.network, err)
			}
			defer echo.Close()
			go func() {
				buf := make([]byte, maxDatagram)
				for {
					n, from, err := echo.ReadFromUDPAddrPort(buf)
					if err != nil {
						return
					}
					_, _ = echo.WriteToUDPAddrPort(buf[:n], from)
				}
			}()
			sock, _ := servedUDPPort(t, tc.network, netip.AddrPortFrom(lo, 0), echo.LocalAddr().(*net.UDPAddr).AddrPort())
			c, err := net.DialUDP(tc.network, nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo, uint16(sock.Port()))))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			want := make([]byte, tc.size)
			for i := range want {
				want[i] = byte(i % 251)
			}
			if _, err := c.Write(want); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, maxDatagram+1)
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, err := c.Read(got)
			if err != nil {
				t.Fatalf("no reply to a %d-byte datagram: %v", tc.size, err)
			}
			if !bytes.Equal(got[:n], want) {
				t.Fatalf("a %d-byte datagram came back as %d bytes, or altered", tc.size, n)
			}
		})
	}
}

// Close ends Serve while clients keep sending: the service socket's drain
// gives up its descriptor rather than read the flood forever.
func TestUDPCloseStopsServeUnderFlood(t *testing.T) {
	sink, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	lo := netip.MustParseAddr("127.0.0.1")
	sock, served := servedUDPPort(t, "udp4", netip.AddrPortFrom(lo, 0), sink.LocalAddr().(*net.UDPAddr).AddrPort())
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo, uint16(sock.Port()))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop := make(chan struct{})
	flooding := make(chan struct{})
	go func() {
		defer close(flooding)
		msg := make([]byte, 16)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = c.Write(msg)
		}
	}()
	defer func() { close(stop); <-flooding }()
	time.Sleep(50 * time.Millisecond)
	sock.Close()
	select {
	case <-served:
	case <-time.After(3 * time.Second):
		t.Fatal("Serve still running 3 s after Close, with clients sending")
	}
}

// A UDP service port holds no datagram buffer of its own, busy or idle:
// one is taken from a shared pool while a socket is drained. Before, each
// port kept two 64 KiB buffers for life (its service socket's and its
// reply loop's), 1.28 GB of live heap at 10,000 UDP ports.
func TestUDPPortsHoldNoReadBuffer(t *testing.T) {
	const ports = 200
	echo := startUDPEcho(t, "127.0.0.2:0", "")
	p := newTestProxier(t, Options{UDPIdleTimeout: time.Minute})
	runtime.GC()
	runtime.GC()
	before := liveHeap()
	goroutinesBefore := runtime.NumGoroutine()
	for i := range ports {
		svc := fmt.Sprintf("dns-%d", i)
		p.OnServiceAdd(makeService(svc, withProtocol(v1.ProtocolUDP)))
		p.OnEndpointSliceAdd(makeSlice(svc, v1.ProtocolUDP, echo.LocalAddr().String()))
	}
	p.Sync()
	// One round trip through each port: its loop has served both ways.
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	for i := range ports {
		to := netip.MustParseAddrPort(proxyAddr(t, p, fmt.Sprintf("default/dns-%d:p", i)))
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.WriteToUDPAddrPort([]byte("q"), to); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("port %d: no reply: %v", i, err)
		}
	}
	// Two collections free what the pool holds for nobody.
	runtime.GC()
	runtime.GC()
	perPort := (float64(liveHeap()) - float64(before)) / ports
	t.Logf("%.0f B of live heap per UDP service port", perPort)
	if perPort > 32<<10 {
		t.Errorf("%.0f B of live heap per UDP service port after a round trip each, want at most 32 KiB (no 64 KiB buffer kept)", perPort)
	}
	// One goroutine serves a port both ways, whatever its sessions (a
	// second one per port, for replies, was 2-8 KiB of stack each).
	if extra := runtime.NumGoroutine() - goroutinesBefore; extra > ports+ports/10 {
		t.Errorf("%d goroutines for %d UDP service ports with a session each, want about 1 per port", extra, ports)
	}
	runtime.KeepAlive(p)
}

func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
