package faults

import (
	"fmt"
	"io"
	"strconv"
	"testing"
)

// The fault-free path: a port without toxics (or whose toxics this
// connection did not draw) answers nil, allocating nothing, so the proxier
// keeps the connection on relay's splice path.
func TestAcceptFaultFreeAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		toxics []string
	}{
		{"no toxics", nil},
		{"toxicity 0", []string{`{"type":"latency","toxicity":0,"attributes":{"latency":1}}`}},
		{"another client's toxic", []string{`{"type":"latency","clients":["192.0.2.0/24"],"attributes":{"latency":1}}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, p := declared(t, 0, 0, "TCP", tc.toxics...)
			allocs := testing.AllocsPerRun(1000, func() {
				if c := p.Accept(client1); c != nil {
					t.Fatal("Accept returned a Conn for a fault-free connection")
				}
			})
			if allocs != 0 {
				t.Fatalf("Accept allocates %v per fault-free connection, want 0", allocs)
			}
		})
	}
}

// BenchmarkAccept: what deciding a connection's faults costs at accept.
func BenchmarkAccept(b *testing.B) {
	for _, tc := range []struct {
		name   string
		toxics []string
	}{
		{"none", nil},
		{"not drawn", []string{`{"type":"latency","toxicity":0,"attributes":{"latency":1}}`}},
		{"latency", []string{`{"type":"latency","attributes":{"latency":1}}`}},
		{"latency+bandwidth+slicer", []string{
			`{"type":"latency","attributes":{"latency":1}}`,
			`{"type":"bandwidth","attributes":{"rate":1000}}`,
			`{"type":"slicer","stream":"upstream","attributes":{"average_size":100}}`,
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			_, p := declared(b, 0, 0, "TCP", tc.toxics...)
			b.ReportAllocs()
			for b.Loop() {
				if c := p.Accept(client1); c != nil {
					c.Done()
				}
			}
		})
	}
}

// BenchmarkFaultPipeline: what a faulted direction costs per chunk on a
// loopback relay, against the fault-free splice and buffered copy. A
// latency of 0 runs the whole pipeline (reader goroutine, stamped chunk,
// channel hand-off, toxic loop) and waits for nothing, so the difference
// to "splice" is the pipeline's own cost.
func BenchmarkFaultPipeline(b *testing.B) {
	cases := []struct {
		name   string
		toxics []string
	}{
		{"splice", nil},
		{"latency0", []string{
			`{"name":"up","type":"latency","stream":"upstream","attributes":{"latency":0}}`,
			`{"name":"down","type":"latency","stream":"downstream","attributes":{"latency":0}}`,
		}},
	}
	for _, size := range []int{64, 1 << 10, 32 << 10} {
		for _, tc := range cases {
			// One op is a request of size bytes echoed back: two chunks,
			// one through each direction's copier.
			b.Run(tc.name+"/"+byteSize(size), func(b *testing.B) {
				_, p := declared(b, 0, 0, "TCP", tc.toxics...)
				client, backend, done := proxied(b, p, client1)
				go func() {
					buf := make([]byte, size)
					for {
						if _, err := io.ReadFull(backend, buf); err != nil {
							return
						}
						if _, err := backend.Write(buf); err != nil {
							return
						}
					}
				}()
				req, resp := make([]byte, size), make([]byte, size)
				b.SetBytes(int64(2 * size))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := client.Write(req); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(client, resp); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				client.Close()
				backend.Close()
				<-done
			})
		}
	}
}

// BenchmarkFaultPipelineStream: bulk throughput one way, 4 MiB per op.
func BenchmarkFaultPipelineStream(b *testing.B) {
	for _, tc := range []struct {
		name   string
		toxics []string
	}{
		{"splice", nil},
		{"latency0", []string{`{"type":"latency","attributes":{"latency":0}}`}},
		{"slicer", []string{`{"type":"slicer","attributes":{"average_size":1024,"size_variation":256}}`}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			const perOp = 4 << 20
			_, p := declared(b, 0, 0, "TCP", tc.toxics...)
			client, backend, done := proxied(b, p, client1)
			go func() {
				buf := make([]byte, 256<<10)
				for {
					if _, err := backend.Write(buf); err != nil {
						return
					}
				}
			}()
			buf := make([]byte, 256<<10)
			b.SetBytes(perOp)
			b.ReportAllocs()
			for b.Loop() {
				for left := perOp; left > 0; {
					n, err := client.Read(buf[:min(left, len(buf))])
					if err != nil {
						b.Fatal(err)
					}
					left -= n
				}
			}
			b.StopTimer()
			client.SetLinger(0)
			client.Close()
			backend.Close()
			<-done
		})
	}
}

func byteSize(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

// BenchmarkToxicChangeAmongMany is one API toxic added and removed on a
// port that already has 2,000 (a suite that adds toxics and never removes
// them): each change republishes the port's snapshot under its lock.
func BenchmarkToxicChangeAmongMany(b *testing.B) {
	tbl := NewTable(0, 0, NewMetrics(nil))
	const name = "default.web.http"
	tbl.Port(name, "TCP")
	for i := range 2000 {
		if _, err := tbl.AddToxic(name, Toxic{Name: fmt.Sprintf("t%d", i), Type: "latency", Attributes: map[string]float64{"latency": 1}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tbl.AddToxic(name, Toxic{Name: "x", Type: "latency", Attributes: map[string]float64{"latency": 1}}); err != nil {
			b.Fatal(err)
		}
		if err := tbl.RemoveToxic(name, "x"); err != nil {
			b.Fatal(err)
		}
	}
}
