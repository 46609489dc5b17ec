package relay

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// processCPU is the CPU time this process has used (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds cpu-ns/op: the whole process's CPU per op (client, relay
// and peer), which a loaded machine's scheduling delays do not inflate the
// way they inflate wall time. Copiers differ only in the relay's share.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
}

// echoPeer echoes everything it reads on c until c ends.
func echoPeer(c *net.TCPConn) {
	buf := make([]byte, 64<<10)
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

// relayedBench is relayed for benchmarks: client ↔ TCP ↔ backend with the
// same copier both ways.
func relayedBench(b *testing.B, copier Copier) (client, backend *net.TCPConn) {
	client, proxyClient := pairB(b)
	proxyBackend, backend := pairB(b)
	go TCP(proxyClient, proxyBackend, Options{Upstream: copier, Downstream: copier})
	return client, backend
}

func pairB(b *testing.B) (x, y *net.TCPConn) {
	b.Helper()
	return pairWith(b, SocketControl(Liveness{}))
}

var benchCopiers = []struct {
	name   string
	copier Copier
}{{"splice", Splice}, {"auto", Auto}, {"buffered", Copy}}

// BenchmarkRelayMessage is one 100-byte request and its echo through the
// relay on a kept-alive connection (two directions, one message each).
func BenchmarkRelayMessage(b *testing.B) {
	for _, c := range benchCopiers {
		b.Run(c.name, func(b *testing.B) {
			client, backend := relayedBench(b, c.copier)
			go echoPeer(backend)
			msg, buf := make([]byte, 100), make([]byte, 100)
			b.ReportAllocs()
			cpu := processCPU()
			defer func() { reportCPU(b, cpu) }()
			for b.Loop() {
				if _, err := client.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(client, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRelayStream is bulk client→backend throughput in 1 MiB writes.
func BenchmarkRelayStream(b *testing.B) {
	for _, c := range benchCopiers {
		b.Run(c.name, func(b *testing.B) {
			client, backend := relayedBench(b, c.copier)
			go func() { _, _ = io.Copy(io.Discard, backend) }()
			chunk := make([]byte, 1<<20)
			b.SetBytes(int64(len(chunk)))
			b.ReportAllocs()
			cpu := processCPU()
			defer func() { reportCPU(b, cpu) }()
			for b.Loop() {
				if _, err := client.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
