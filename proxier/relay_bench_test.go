package proxier_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// The relay benchmarks run the real proxy sockets on loopback, without
// iptables: the client talks to the proxy port itself. Each has a "direct"
// twin that talks to the backend, so the proxy's own cost is the difference.

// benchDatagram is a DNS-sized request.
const benchDatagram = 64

// startUDPEcho serves a UDP echo on loopback until the benchmark ends.
func startUDPEcho(b *testing.B) netip.AddrPort {
	b.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 64*1024)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = conn.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// startHTTPish answers every connection's request line with a fixed small
// HTTP response and closes, as a Connection: close server does.
func startHTTPish(b *testing.B) netip.AddrPort {
	b.Helper()
	// Plain TCP, as most backends listen (Go's default listener is MPTCP).
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ln := l.(*net.TCPListener)
	b.Cleanup(func() { ln.Close() })
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
	go func() {
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReaderSize(c, 512)
				if _, err := r.ReadSlice('\n'); err != nil {
					return
				}
				_, _ = c.Write(resp)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// proxiedPort builds a proxier (no iptables) with one Service port of
// proto whose only endpoint is backend, and returns the proxy socket's
// loopback address.
func proxiedPort(b *testing.B, proto v1.Protocol, backend netip.AddrPort) netip.AddrPort {
	return proxiedPortWith(b, proto, backend, proxier.Options{})
}

// proxiedPortWith is proxiedPort with the proxier's options (BindAddress is
// set here).
func proxiedPortWith(b *testing.B, proto v1.Protocol, backend netip.AddrPort, opts proxier.Options) netip.AddrPort {
	b.Helper()
	quietKlog()
	opts.BindAddress = benchLoopback
	p := proxier.New(opts)
	b.Cleanup(func() { stopBenchProxier(p) })
	portName, port := "p", int32(backend.Port())
	p.OnServiceAdd(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: "relay"},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"},
			Ports: []v1.ServicePort{{Name: portName, Port: 80, Protocol: proto, TargetPort: intstr.FromInt32(port)}},
		},
	})
	p.OnEndpointSliceAdd(&discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: benchNamespace, Name: "relay-1",
			Labels: map[string]string{discovery.LabelServiceName: "relay"},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
		Endpoints:   []discovery.Endpoint{{Addresses: []string{backend.Addr().String()}}},
	})
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.Sync()
	proxyPort, ok := p.ProxyPort(benchNamespace + "/relay:p")
	if !ok {
		b.Fatal("no proxy socket for the relay service")
	}
	return netip.AddrPortFrom(benchLoopback, uint16(proxyPort))
}

// BenchmarkUDPRelay is one request/response round trip of a small datagram:
// "direct" to the echo server, "proxied" through the proxy socket (client →
// proxy → backend → proxy → client); "proxied-parallel" uses one client
// socket (one proxy session) per goroutine.
func BenchmarkUDPRelay(b *testing.B) {
	echo := startUDPEcho(b)
	b.Run("direct", func(b *testing.B) { benchUDPRoundTrips(b, echo) })
	proxy := proxiedPort(b, v1.ProtocolUDP, echo)
	b.Run("proxied", func(b *testing.B) { benchUDPRoundTrips(b, proxy) })
	b.Run("proxied-parallel", func(b *testing.B) {
		b.SetBytes(benchDatagram)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			c := dialUDP(b, to(proxy))
			defer c.Close()
			buf := make([]byte, 2048)
			for pb.Next() {
				if err := udpRoundTrip(c, buf); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	// make bench's UDP load: 16 client sockets (16 proxy sessions), each
	// with 4 datagrams in flight, so the proxy's sockets hold several
	// datagrams per wake-up. cpu-ns/op is the whole process's CPU (clients,
	// proxy, echo) per round trip; the proxy's share is the difference to
	// direct-pipelined.
	b.Run("direct-pipelined", func(b *testing.B) { benchUDPPipelined(b, echo, 16, 4) })
	b.Run("proxied-pipelined", func(b *testing.B) { benchUDPPipelined(b, proxy, 16, 4) })
	// A DNS query from a resolver that opens a socket per query: every
	// round trip is a new proxy session (socket, connect, first datagram;
	// the session idles out or is evicted later).
	b.Run("direct-new-client", func(b *testing.B) { benchUDPNewClients(b, echo) })
	b.Run("proxied-new-client", func(b *testing.B) { benchUDPNewClients(b, proxy) })
}

func benchUDPNewClients(b *testing.B, addr netip.AddrPort) {
	buf := make([]byte, 2048)
	b.ReportAllocs()
	cpu := processCPU()
	for b.Loop() {
		c := dialUDP(b, to(addr))
		err := udpRoundTrip(c, buf)
		c.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
}

// benchUDPPipelined runs b.N round trips over flows client sockets, each
// keeping window datagrams in flight (a new one for every echo), and
// reports the process CPU per round trip and the datagrams lost.
func benchUDPPipelined(b *testing.B, addr netip.AddrPort, flows, window int) {
	conns := make([]*net.UDPConn, flows)
	buf := make([]byte, 2048)
	for i := range conns {
		conns[i] = dialUDP(b, to(addr))
		defer conns[i].Close()
		// Open the flow's session outside the timing.
		if err := udpRoundTrip(conns[i], buf); err != nil {
			b.Fatal(err)
		}
	}
	var left, lost atomic.Int64
	left.Store(int64(b.N))
	b.SetBytes(benchDatagram)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := processCPU()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			buf := make([]byte, 2048)
			inFlight := 0
			send := func() bool {
				if left.Add(-1) < 0 {
					return false
				}
				if _, err := c.Write(buf[:benchDatagram]); err != nil {
					b.Error(err)
					return false
				}
				inFlight++
				return true
			}
			for range window {
				if !send() {
					break
				}
			}
			for inFlight > 0 {
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				if _, err := c.Read(buf); err != nil {
					lost.Add(int64(inFlight)) // the rest of the window
					return
				}
				inFlight--
				send()
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(lost.Load()), "lost")
}

func to(a netip.AddrPort) *net.UDPAddr { return net.UDPAddrFromAddrPort(a) }

func dialUDP(b *testing.B, addr *net.UDPAddr) *net.UDPConn {
	c, err := net.DialUDP("udp", nil, addr)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func benchUDPRoundTrips(b *testing.B, addr netip.AddrPort) {
	c := dialUDP(b, to(addr))
	defer c.Close()
	buf := make([]byte, 2048)
	// The first datagram opens the proxy session; keep it out of the timing.
	if err := udpRoundTrip(c, buf); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchDatagram)
	b.ReportAllocs()
	for b.Loop() {
		if err := udpRoundTrip(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// processCPU is the CPU time this process has used (user + system): per op
// (client, proxy and backend together) it is what a loaded machine's
// scheduling delays do not inflate the way they inflate wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func heapAlloc() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// udpRoundTrip sends one datagram and waits (bounded) for its echo.
func udpRoundTrip(c *net.UDPConn, buf []byte) error {
	if _, err := c.Write(buf[:benchDatagram]); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if n != benchDatagram {
		return errors.New("short echo: " + strconv.Itoa(n) + " bytes")
	}
	return nil
}

// BenchmarkTCPConnectRequest is one HTTP/1.1 Connection: close exchange on
// a new connection (connect, request, response, close), as wrk -H
// "Connection: close" does: "direct" to the backend, "proxied" through the
// proxy socket (accept, pick, dial, splice both ways, half-close),
// "proxied-mptcp" through a proxy socket listening with Multipath TCP (Go's
// default listener since 1.24; --mptcp), and "proxied-no-keepalive" with
// keep-alive, user timeout, write bound and half-close bound off
// ("proxied" has the binary's defaults: the listener's options cost
// nothing per connection, the backend socket's five setsockopt calls a
// little). retained-B/op is the heap still live after a collection once
// the connections closed: what a finished connection leaves behind.
func BenchmarkTCPConnectRequest(b *testing.B) {
	backend := startHTTPish(b)
	b.Run("direct", func(b *testing.B) { benchConnectRequest(b, backend) })
	bare := proxiedPort(b, v1.ProtocolTCP, backend)
	b.Run("proxied-no-keepalive", func(b *testing.B) { benchConnectRequest(b, bare) })
	proxy := proxiedPortWith(b, v1.ProtocolTCP, backend, proxier.Options{
		Liveness: proxier.DefaultLiveness, WriteTimeout: proxier.DefaultTCPWriteTimeout,
		HalfCloseTimeout: 2 * time.Minute, // --tcp-half-close-timeout's default
	})
	b.Run("proxied", func(b *testing.B) { benchConnectRequest(b, proxy) })
	loop := proxiedPortWith(b, v1.ProtocolTCP, backend, proxier.Options{
		Liveness: proxier.DefaultLiveness, WriteTimeout: proxier.DefaultTCPWriteTimeout,
		HalfCloseTimeout: 2 * time.Minute, DataPath: proxier.DataPathEventLoop,
	})
	b.Run("proxied-eventloop", func(b *testing.B) { benchConnectRequest(b, loop) })
	mptcp := proxiedPortWith(b, v1.ProtocolTCP, backend, proxier.Options{MultipathTCP: true})
	b.Run("proxied-mptcp", func(b *testing.B) { benchConnectRequest(b, mptcp) })
}

// BenchmarkTCPConnectRequestParallel is BenchmarkTCPConnectRequest's
// exchange from GOMAXPROCS clients at once on the event loops, which then
// race for the shared listener: "faults" with a fault table and no toxic
// (the binary without the fault API), "faultapi" with the fault API's
// tracking on, when the loops accept the port's clients one at a time
// (their numbers may decide a down toxic's cut).
func BenchmarkTCPConnectRequestParallel(b *testing.B) {
	backend := startHTTPish(b)
	for _, tc := range []struct {
		name  string
		track bool
	}{{"eventloop-faults", false}, {"eventloop-faultapi", true}} {
		table := faults.NewTable(0, 0, nil)
		table.TrackLive = tc.track
		addr := proxiedPortWith(b, v1.ProtocolTCP, backend, proxier.Options{
			Liveness: proxier.DefaultLiveness, WriteTimeout: proxier.DefaultTCPWriteTimeout,
			HalfCloseTimeout: 2 * time.Minute, DataPath: proxier.DataPathEventLoop, Faults: table,
		})
		b.Run(tc.name, func(b *testing.B) {
			req := []byte("GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
			cpu := processCPU()
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]byte, 512)
				for pb.Next() {
					c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(addr))
					if err != nil {
						b.Error(err)
						return
					}
					if _, err := c.Write(req); err != nil {
						b.Error(err)
					}
					_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
					if _, err := io.ReadAll(io.LimitReader(c, int64(len(buf)))); err != nil {
						b.Error(err)
					}
					c.Close()
				}
			})
			b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

func benchConnectRequest(b *testing.B, addr netip.AddrPort) {
	req := []byte("GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
	buf := make([]byte, 512)
	b.ReportAllocs()
	runtime.GC()
	heap0 := heapAlloc()
	cpu := processCPU()
	defer func() {
		b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
		time.Sleep(100 * time.Millisecond) // the proxy's goroutines finish
		runtime.GC()
		b.ReportMetric(max(float64(heapAlloc())-float64(heap0), 0)/float64(b.N), "retained-B/op")
	}()
	for b.Loop() {
		c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(addr))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n := 0
		for {
			m, err := c.Read(buf[n:])
			n += m
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		c.Close()
		if n == 0 {
			b.Fatal("empty response")
		}
	}
}
