package proxier_test

import (
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// startTCPEcho echoes small messages on loopback. At cleanup it closes every
// connection and waits for its goroutines, so that the next benchmark
// starts from a settled process.
func startTCPEcho(b *testing.B) netip.AddrPort {
	b.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []*net.TCPConn
	b.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				echoSmall(c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// echoSmall echoes through a 512-byte buffer, so the echo side adds little
// to the per-connection memory figures.
func echoSmall(c *net.TCPConn) {
	buf := make([]byte, 512)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// BenchmarkTCPKeepAliveMessage is one 100-byte request and its echo on a
// kept-alive connection (the keep-alive HTTP pattern): "direct" to the echo
// server, "proxied" through the proxy socket.
func BenchmarkTCPKeepAliveMessage(b *testing.B) {
	echo := startTCPEcho(b)
	b.Run("direct", func(b *testing.B) { benchKeepAlive(b, echo) })
	proxy := proxiedPort(b, v1.ProtocolTCP, echo)
	b.Run("proxied", func(b *testing.B) { benchKeepAlive(b, proxy) })
	loop := proxiedPortWith(b, v1.ProtocolTCP, echo, proxier.Options{DataPath: proxier.DataPathEventLoop})
	b.Run("proxied-eventloop", func(b *testing.B) { benchKeepAlive(b, loop) })
}

func benchKeepAlive(b *testing.B, addr netip.AddrPort) {
	c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(addr))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	msg, buf := make([]byte, 100), make([]byte, 100)
	b.ReportAllocs()
	cpu := processCPU()
	defer func() { b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op") }()
	for b.Loop() {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTCPKeepAliveParallel is BenchmarkTCPKeepAliveMessage on 64
// kept-alive connections at once, opened together as wrk -c64 opens them:
// what spreading a burst of clients over the event loops is for.
func BenchmarkTCPKeepAliveParallel(b *testing.B) {
	echo := startTCPEcho(b)
	b.Run("direct", func(b *testing.B) { benchKeepAliveParallel(b, echo) })
	proxy := proxiedPort(b, v1.ProtocolTCP, echo)
	b.Run("proxied", func(b *testing.B) { benchKeepAliveParallel(b, proxy) })
	loop := proxiedPortWith(b, v1.ProtocolTCP, echo, proxier.Options{DataPath: proxier.DataPathEventLoop})
	b.Run("proxied-eventloop", func(b *testing.B) { benchKeepAliveParallel(b, loop) })
}

func benchKeepAliveParallel(b *testing.B, addr netip.AddrPort) {
	const conns = 64
	b.SetParallelism((conns + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	cpu := processCPU()
	defer func() { b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op") }()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(addr))
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		msg, buf := make([]byte, 100), make([]byte, 100)
		for pb.Next() {
			if _, err := c.Write(msg); err != nil {
				b.Error(err)
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkTCPIdleConnections holds benchIdleConns proxied connections
// after one exchange each and reports what one idle connection costs the
// proxy: descriptors, heap bytes and goroutine stack bytes (the echo
// server's goroutine and 512-byte buffer are included; the client's and
// the echo's sockets are not). The timed op is empty; the metrics are the
// result. The side-by-side run measures the same thing as process RSS.
func BenchmarkTCPIdleConnections(b *testing.B) {
	for _, path := range proxier.DataPaths {
		b.Run(path, func(b *testing.B) { benchIdleConnections(b, path) })
	}
}

func benchIdleConnections(b *testing.B, path string) {
	const benchIdleConns = 500
	echo := startTCPEcho(b)
	proxy := proxiedPortWith(b, v1.ProtocolTCP, echo, proxier.Options{DataPath: path})
	// Two collections empty sync.Pools (and their victim caches) of earlier
	// benchmarks, so that their finalized descriptors do not move the baseline.
	runtime.GC()
	runtime.GC()
	fds0 := settledFDs(b)
	stack0, heap0 := memInuse()

	clients := make([]*net.TCPConn, 0, benchIdleConns)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	buf := make([]byte, 1)
	for range benchIdleConns {
		c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(proxy))
		if err != nil {
			b.Fatal(err)
		}
		clients = append(clients, c)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC() // shrinks the stacks that grew while dialing and copying
	runtime.GC()
	fds := float64(settledFDs(b)-fds0)/benchIdleConns - 2
	stack1, heap1 := memInuse()
	for b.Loop() {
	}
	b.ReportMetric(fds, "proxy-fds/conn")
	b.ReportMetric((float64(heap1)-float64(heap0))/benchIdleConns, "heap-B/conn")
	b.ReportMetric((float64(stack1)-float64(stack0))/benchIdleConns, "stack-B/conn")
}

// settledFDs counts this process's descriptors once the count is stable
// (finalizers of pooled pipes close theirs asynchronously).
func settledFDs(b *testing.B) int {
	n := openFDs(b)
	for range 50 {
		time.Sleep(20 * time.Millisecond)
		m := openFDs(b)
		if m == n {
			return n
		}
		n = m
	}
	return n
}

func openFDs(b *testing.B) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		b.Skip("no /proc/self/fd:", err)
	}
	return len(ents)
}

func memInuse() (stack, heap uint64) {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.StackInuse, m.HeapInuse
}
