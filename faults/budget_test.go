package faults

import (
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// stream has backend write until its connection fails, and client read
// everything; it returns what the client read so far.
func stream(t *testing.T, client, backend *net.TCPConn) *atomic.Int64 {
	t.Helper()
	var got atomic.Int64
	go func() {
		buf := make([]byte, 32<<10)
		for {
			if _, err := backend.Write(buf); err != nil {
				return
			}
		}
	}()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := client.Read(buf)
			got.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	return &got
}

// Faulted directions hold at most --fault-max-buffered-bytes together
// (plus one read each), however many there are; each still moves. Before
// the bound each held its own 4 MiB: 8 latency-faulted streams held 32 MiB
// against a bound of 8 MiB.
func TestBufferedBytesBounded(t *testing.T) {
	const conns, bound = 8, 8 << 20
	tbl, p := declared(t, 0, 0, "TCP", `{"type":"latency","attributes":{"latency":1500}}`)
	tbl.SetMaxBufferedBytes(bound)
	var got []*atomic.Int64
	var ends []*net.TCPConn
	var dones []chan struct{}
	for range conns {
		client, backend, done := proxied(t, p, client1)
		got = append(got, stream(t, client, backend))
		ends = append(ends, client, backend)
		dones = append(dones, done)
	}
	var peak int64
	for start := time.Now(); time.Since(start) < 3*time.Second; time.Sleep(10 * time.Millisecond) {
		held, _ := tbl.BufferedBytes()
		peak = max(peak, held)
	}
	if limit := int64(bound + conns*readCost); peak > limit {
		t.Errorf("%d latency-faulted streams held up to %d bytes together; want at most %d (bound %d and a read each)", conns, peak, limit, bound)
	}
	for i, g := range got {
		if g.Load() == 0 {
			t.Errorf("stream %d delivered nothing in 3 s under a 1.5 s latency", i)
		}
	}
	for _, c := range ends {
		c.Close()
	}
	for _, d := range dones {
		relayEnds(t, d)
	}
	// A reader still in its read when the relay ended gives its
	// reservation back when that read fails, just after.
	held, _ := tbl.BufferedBytes()
	for deadline := time.Now().Add(2 * time.Second); held != 0 && time.Now().Before(deadline); held, _ = tbl.BufferedBytes() {
		time.Sleep(10 * time.Millisecond)
	}
	if held != 0 {
		t.Errorf("after every connection ended the faulted directions hold %d bytes, want 0", held)
	}
}

// A direction that holds nothing always reads, whatever others hold: with
// a bound of one byte, spent by a bandwidth 0 hold that never gives its
// bytes back, a latency-faulted stream still moves, a read at a time.
func TestBufferedBytesNeverStall(t *testing.T) {
	tbl, p := declared(t, 0, 0, "TCP",
		`{"type":"bandwidth","clients":["10.0.0.2/32"],"attributes":{"rate":0}}`,
		`{"type":"latency","clients":["10.0.0.1/32"],"attributes":{"latency":20}}`)
	tbl.SetMaxBufferedBytes(1)
	// The hold ends its connection once its source ended (holdEnded).
	o := relay.Options{HalfCloseTimeout: 100 * time.Millisecond}
	holdClient, holdBackend, holdDone := proxiedWith(t, p, mustAddr("10.0.0.2"), o)
	stream(t, holdClient, holdBackend)
	client, backend, done := proxied(t, p, client1)
	got := stream(t, client, backend)
	deadline := time.Now().Add(5 * time.Second)
	for got.Load() < 1<<20 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := got.Load(); n < 1<<20 {
		held, _ := tbl.BufferedBytes()
		t.Errorf("the latency-faulted stream delivered %d bytes in 5 s beside a hold (faulted directions hold %d); want 1 MiB", n, held)
	}
	for _, c := range []*net.TCPConn{client, backend, holdClient, holdBackend} {
		c.Close()
	}
	relayEnds(t, done)
	relayEnds(t, holdDone)
}

// Once what faulted directions held falls from over 64 MiB to under
// 8 MiB, the heap is given back to the system, twice (a pooled buffer
// survives one collection), and only then: an idle process kept what 300
// latency-faulted streams held for 4 minutes after they ended (1.27 GB).
func TestBufferedBytesGivenBackAfterDrop(t *testing.T) {
	defer func(after, every time.Duration, free func()) {
		trimAfter, trimEvery, freeOSMemory = after, every, free
	}(trimAfter, trimEvery, freeOSMemory)
	var frees atomic.Int32
	trimAfter, trimEvery, freeOSMemory = 0, 0, func() { frees.Add(1) }
	settled := func(want int32) {
		t.Helper()
		time.Sleep(50 * time.Millisecond)
		if n := frees.Load(); n != want {
			t.Fatalf("the heap was given back %d times, want %d", n, want)
		}
	}
	var b bufferBudget
	b.took(b.held.Add(32 << 20))
	b.give(32<<20 - 1<<20)
	settled(0) // never over 64 MiB
	b.took(b.held.Add(100 << 20))
	b.give(90 << 20)
	settled(0) // still over 8 MiB
	b.give(10 << 20)
	settled(2)
	b.took(b.held.Add(1 << 20))
	b.give(1 << 20)
	settled(2) // no burst since
}

// UDP datagrams a latency toxic delays count in --fault-max-buffered-bytes
// with the faulted TCP directions: each port's delay line was bounded only
// by its own 16 MiB, so N ports under latency could hold N × 16 MiB (with
// both directions, 32 MiB a port) whatever the flag said. A line holding
// nothing still takes a datagram, as a TCP direction holding nothing still
// reads.
func TestBufferedBytesBoundDelayedDatagrams(t *testing.T) {
	const max = 1 << 20
	tbl := NewTable(0, 0, nil)
	tbl.SetMaxBufferedBytes(max)
	latency := []Toxic{toxic(t, `{"name":"slow","type":"latency","attributes":{"latency":3600000}}`)}
	dg := make([]byte, 60000)
	var ports []*Port
	taken := 0
	for i := range 4 {
		p := tbl.Port(fmt.Sprintf("default.web%d.udp", i), "UDP")
		p.SetDeclared(latency)
		ports = append(ports, p)
		for range 10 { // 600 KB a port: within its own line's bound
			before := p.snap.Load().delayDropped.n.Load()
			p.Datagrams().Send(StreamDown, session1, dg, func([]byte) {})
			if p.snap.Load().delayDropped.n.Load() == before {
				taken++
			}
		}
	}
	inLines := 0
	for _, p := range ports {
		inLines += p.udpDelays[StreamDown].len()
	}
	if inLines > max+len(ports)*len(dg) { // one datagram over, at most, per line
		t.Errorf("delayed datagrams hold %d bytes (%d datagrams of %d) with --fault-max-buffered-bytes %d", inLines, taken, len(dg), max)
	}
	if held, _ := tbl.BufferedBytes(); held != int64(inLines) {
		t.Errorf("kubeproxy_userspace_faults_buffered_bytes says %d, the delay lines hold %d", held, inLines)
	}
	if want := max / len(dg); taken < want {
		t.Errorf("%d datagrams taken, want at least %d (the bound's worth)", taken, want)
	}
	// Dropping what the lines hold (a port disabled) gives the bytes back.
	for _, p := range ports {
		p.dropDelayedDatagrams(nil)
	}
	if held, _ := tbl.BufferedBytes(); held != 0 {
		t.Errorf("%d bytes still counted after the delay lines were emptied", held)
	}
}
