package proxier_test

import (
	"io"
	"net"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// streamChunk is what the client writes per op: iperf3's default TCP
// block size.
const streamChunk = 128 << 10

// startTCPSink reads and discards every connection's bytes, as an iperf3
// server does.
func startTCPSink(b *testing.B) netip.AddrPort {
	b.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, struct{ io.Reader }{c}) // a plain read loop, no splice to /dev/null
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// BenchmarkTCPStream is one stream's bulk transfer (iperf3 -c without
// -R): each op writes streamChunk bytes; "direct" to the sink, "proxied"
// through a proxy socket relayed by goroutines, "proxied-eventloop" by
// the event loop. cpu-ns/op is the whole process (client, relay, sink):
// the relay's cost is the difference from direct.
func BenchmarkTCPStream(b *testing.B) {
	sink := startTCPSink(b)
	b.Run("direct", func(b *testing.B) { benchStream(b, sink) })
	proxy := proxiedPort(b, v1.ProtocolTCP, sink)
	b.Run("proxied", func(b *testing.B) { benchStream(b, proxy) })
	loop := proxiedPortWith(b, v1.ProtocolTCP, sink, proxier.Options{DataPath: proxier.DataPathEventLoop})
	b.Run("proxied-eventloop", func(b *testing.B) { benchStream(b, loop) })
}

func benchStream(b *testing.B, addr netip.AddrPort) {
	c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(addr))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	chunk := make([]byte, streamChunk)
	b.SetBytes(streamChunk)
	b.ReportAllocs()
	cpu := processCPU()
	defer func() { b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op") }()
	for b.Loop() {
		if _, err := c.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
}
