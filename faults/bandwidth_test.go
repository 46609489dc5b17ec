package faults

import (
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// bandwidth holds each chunk for its own time at the rate before it is
// written, as Toxiproxy's does (toxics/bandwidth.go: sleep len/rate, then
// send): a 2,000-byte answer at 100 KB/s arrives 20 ms late, every time.
// Paced after the write instead, a message that fitted in one write went
// through at once (0 ms) and only the next one paid, so request/response
// tests saw no slow link at all.
func TestBandwidthDelaysEachMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate  int // KB/s
		bytes int
	}{
		{100, 2000},   // 20 ms
		{100, 5000},   // 50 ms
		{1000, 20000}, // 20 ms
	} {
		_, p := declared(t, 0, 0, "TCP", `{"type":"bandwidth","attributes":{"rate":`+strconv.Itoa(tc.rate)+`}}`)
		client, backend, _ := proxied(t, p, client1)
		want := time.Duration(tc.bytes) * time.Second / time.Duration(tc.rate*1000)
		var took []time.Duration
		for range 3 {
			start := time.Now()
			if _, err := backend.Write(make([]byte, tc.bytes)); err != nil {
				t.Fatal(err)
			}
			client.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(client, make([]byte, tc.bytes)); err != nil {
				t.Fatal(err)
			}
			took = append(took, time.Since(start))
			time.Sleep(200 * time.Millisecond) // idle: no credit is earned
		}
		slices.Sort(took)
		t.Logf("%d B at %d KB/s: %v (want %v each)", tc.bytes, tc.rate, took, want)
		// None early (the bound is the point); the median on time.
		if took[0] < want*8/10 {
			t.Errorf("%d B at %d KB/s arrived after %v; want at least %v", tc.bytes, tc.rate, took[0], want*8/10)
		}
		if took[1] > want+100*time.Millisecond {
			t.Errorf("%d B at %d KB/s arrived after %v (median); want %v + 100 ms at most", tc.bytes, tc.rate, took[1], want)
		}
	}
}

// rate 0 holds the stream's data, as Toxiproxy's bandwidth 0 does (the
// Testcontainers idiom for a cut connection): nothing is delivered and
// nothing is dropped or closed, the other stream flows, and the connection
// ends when a peer ends it. An omitted rate is 0, as there.
func TestBandwidthZeroHoldsTheStream(t *testing.T) {
	t.Parallel()
	for _, js := range []string{
		`{"type":"bandwidth","attributes":{"rate":0}}`,
		`{"type":"bandwidth"}`,
		`{"name":"a","type":"bandwidth","attributes":{"rate":100}}`, // with the narrowest of two
	} {
		toxics := []string{js}
		if js[2:6] == "name" {
			toxics = append(toxics, `{"name":"b","type":"bandwidth","attributes":{"rate":0}}`)
		}
		_, p := declared(t, 0, 0, "TCP", toxics...)
		client, backend, done := proxied(t, p, client1)
		if _, err := backend.Write([]byte("answer")); err != nil {
			t.Fatal(err)
		}
		client.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if n, err := client.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s: client read %d bytes, %v; want nothing", toxics, n, err)
		}
		if _, err := client.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		backend.SetReadDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, 7)
		if _, err := io.ReadFull(backend, got); err != nil || string(got) != "request" {
			t.Fatalf("%s: backend read %q, %v; want the request", toxics, got, err)
		}
		// A held stream waits on its destination, so a reset there ends
		// it at once (a FIN would only half-close: the answer is still
		// owed, as under an hour's latency).
		client.SetLinger(0)
		client.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the relay did not end when the client reset", toxics)
		}
	}
}

// A held stream whose source ended (its peer closed or reset) can never
// deliver what it holds, nor that end, and no direction of the relay
// returned, so the relay's half-close bound never ran: a client that gave
// up on a cut connection left it, its goroutines and its --fault-max-active
// slot for as long as the backend kept the connection (a database: for
// ever). Now both peers are reset the half-close bound after the source
// ended; with no bound it is held, as in Toxiproxy.
func TestBandwidthZeroHoldEndsAfterItsSourceEnds(t *testing.T) {
	t.Parallel()
	const bound = 200 * time.Millisecond
	reset := func(c *net.TCPConn) { c.SetLinger(0); c.Close() }
	for _, tc := range []struct {
		name   string
		stream string
		// hold gets a chunk held; end ends the stream's source.
		hold func(client, backend *net.TCPConn)
		end  func(client, backend *net.TCPConn)
	}{
		{"upstream, the client closes", "upstream",
			func(c, _ *net.TCPConn) { c.Write([]byte("request")) },
			func(c, _ *net.TCPConn) { c.Close() }},
		{"downstream, the backend resets", "downstream",
			func(_, b *net.TCPConn) { b.Write([]byte("answer")) },
			func(_, b *net.TCPConn) { reset(b) }},
		{"downstream, both peers close", "downstream",
			func(_, b *net.TCPConn) { b.Write([]byte("answer")) },
			func(c, b *net.TCPConn) { c.Close(); b.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, hcBound := range []time.Duration{bound, 0} {
				tbl, p := declared(t, 0, 1, "TCP", `{"type":"bandwidth","stream":"`+tc.stream+`","attributes":{"rate":0}}`)
				tbl.TrackLive = true
				client, backend, done := proxiedWith(t, p, client1, relay.Options{HalfCloseTimeout: hcBound})
				tc.hold(client, backend)
				time.Sleep(50 * time.Millisecond) // the chunk reaches the toxic
				start := time.Now()
				tc.end(client, backend)
				if hcBound == 0 {
					// No bound: held, as Toxiproxy holds it.
					select {
					case <-done:
						t.Fatal("with no half-close bound the held stream ended")
					case <-time.After(3 * bound):
					}
					client.Close()
					backend.Close()
					continue
				}
				select {
				case <-done:
				case <-time.After(3 * time.Second):
					t.Fatalf("the relay still runs %v after the stream's source ended (half-close bound %v)", time.Since(start).Round(time.Millisecond), bound)
				}
				if took := time.Since(start); took < bound-20*time.Millisecond {
					t.Errorf("ended %v after the source, before the bound %v", took, bound)
				}
				if n := p.active.Load(); n != 0 {
					t.Errorf("%d --fault-max-active slots still held", n)
				}
			}
		})
	}
}

// A hold that has taken in its 4 MiB in flight reads no further, so the
// source's reset never reached its reader: the connection, its goroutines
// and its --fault-max-active slot stayed until the destination's peer
// ended it (a database's idle connection: never). The holding writer now
// looks at the source's state itself.
func TestBandwidthZeroHoldPastItsBudgetSeesItsSourceReset(t *testing.T) {
	t.Parallel()
	const bound = 200 * time.Millisecond
	tbl, p := declared(t, 0, 1, "TCP", `{"type":"bandwidth","stream":"upstream","attributes":{"rate":0}}`)
	tbl.TrackLive = true
	client, backend, done := proxiedWith(t, p, client1, relay.Options{HalfCloseTimeout: bound})
	defer backend.Close()
	go func() { _, _ = client.Write(make([]byte, 16<<20)) }() // blocks: held
	time.Sleep(300 * time.Millisecond)
	client.SetLinger(0)
	client.Close()
	start := time.Now()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("the relay still runs %v after the client's reset (half-close bound %v)", time.Since(start).Round(time.Millisecond), bound)
	}
	t.Logf("the relay ended %v after the client's reset", time.Since(start).Round(time.Millisecond))
	if n := p.active.Load(); n != 0 {
		t.Errorf("%d --fault-max-active slots still held", n)
	}
}

// rate is in KB/s of 1,000 bytes, as Toxiproxy's (len * ms / rate): 100,000
// bytes at 100 KB/s take a second, never less (paced from when the proxy
// read them, after the write began). Found by mutation: 1 KB = 1,024 bytes
// (977 ms) passed every test, whose lower bounds allowed 20 % early.
func TestBandwidthKilobyteIs1000Bytes(t *testing.T) {
	t.Parallel()
	_, p := declared(t, 0, 0, "TCP", `{"type":"bandwidth","attributes":{"rate":100}}`)
	client, backend, done := proxied(t, p, client1)
	const size, want = 100_000, time.Second
	start := time.Now()
	go backend.Write(make([]byte, size))
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(client, make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	// A millisecond for the float arithmetic of the pacing; a late
	// runner only adds.
	if took := time.Since(start); took < want-time.Millisecond || took > want+time.Second {
		t.Fatalf("%d bytes at 100 KB/s took %v; want %v", size, took, want)
	}
	client.Close()
	backend.Close()
	relayEnds(t, done)
}
