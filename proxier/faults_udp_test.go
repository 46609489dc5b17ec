package proxier

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// udpSink is a UDP backend that records the sequence number each datagram
// carries, in arrival order.
type udpSink struct {
	conn *net.UDPConn
	mu   sync.Mutex
	seqs []uint32
	// got and top (the highest sequence number + 1) let the sender pace;
	// progress wakes it when top moved.
	got, top atomic.Int64
	progress chan struct{}
}

func startUDPSink(t *testing.T) *udpSink {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := &udpSink{conn: c, progress: make(chan struct{}, 1)}
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if n < 4 {
				continue
			}
			seq := binary.BigEndian.Uint32(buf)
			s.mu.Lock()
			s.seqs = append(s.seqs, seq)
			s.mu.Unlock()
			s.got.Add(1)
			if int64(seq)+1 > s.top.Load() {
				s.top.Store(int64(seq) + 1) // this goroutine is the only writer
				select {
				case s.progress <- struct{}{}:
				default:
				}
			}
		}
	}()
	return s
}

func (s *udpSink) received() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seqs)
}

// udpDrops sums the kernel's drop counters (/proc/net/udp) of the
// sockets bound to these local ports: a test that counts losses must know
// the kernel lost none of its own.
func udpDrops(t *testing.T, ports ...int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/udp")
	if err != nil {
		t.Skipf("no /proc/net/udp: %v", err)
	}
	total := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 13 {
			continue
		}
		_, hexPort, _ := strings.Cut(f[1], ":")
		port, _ := strconv.ParseInt(hexPort, 16, 32)
		if slices.Contains(ports, int(port)) {
			n, _ := strconv.Atoi(f[len(f)-1])
			total += n
		}
	}
	return total
}

// sendNumbered sends datagrams 0..n-1 through addr, keeping at most
// window of them ahead of the highest the sink has seen so that no socket
// buffer overflows, then waits until the sink is quiet. It returns the
// sequence numbers received.
func sendNumbered(t *testing.T, addr string, sink *udpSink, n int) []uint32 {
	t.Helper()
	const window = 32
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	proxyPort := int(netip.MustParseAddrPort(addr).Port())
	sinkPort := sink.conn.LocalAddr().(*net.UDPAddr).Port
	drops := udpDrops(t, proxyPort, sinkPort)
	buf := make([]byte, 16)
	for i := range n {
		for int64(i)-sink.top.Load() > window {
			select {
			case <-sink.progress:
			case <-time.After(5 * time.Second):
				t.Fatalf("datagram %d: the sink saw nothing past %d for 5 s", i, sink.top.Load())
			}
		}
		binary.BigEndian.PutUint32(buf, uint32(i))
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	// Quiet: nothing new for 100 ms.
	for last := int64(-1); ; {
		time.Sleep(100 * time.Millisecond)
		got := sink.got.Load()
		if got == last {
			break
		}
		last = got
	}
	if d := udpDrops(t, proxyPort, sinkPort) - drops; d > 0 {
		t.Fatalf("the kernel dropped %d datagrams on the way: the count is not the toxic's", d)
	}
	return sink.received()
}

// lost lists the sequence numbers below n that never arrived.
func lost(n int, got []uint32) []uint32 {
	seen := make([]bool, n)
	for _, s := range got {
		seen[s] = true
	}
	var out []uint32
	for i, ok := range seen {
		if !ok {
			out = append(out, uint32(i))
		}
	}
	return out
}

// loss 0.5 over 10,000 datagrams loses 50 ± 2 %, the same datagrams in two
// runs with the same seed and others with another seed.
func TestFaultUDPLoss(t *testing.T) {
	t.Parallel()
	const n = 10_000
	run := func(seed int64) []uint32 {
		sink := startUDPSink(t)
		addrs := faultedProxies(t, seed, v1.ProtocolUDP, sink.conn.LocalAddr().String(),
			`[{"type":"loss","stream":"upstream","attributes":{"rate":0.5}}]`)
		l := lost(n, sendNumbered(t, addrs[0], sink, n))
		t.Logf("seed %d: lost %d of %d (%.2f %%)", seed, len(l), n, float64(len(l))*100/n)
		if len(l) < n*48/100 || len(l) > n*52/100 {
			t.Errorf("seed %d: lost %d of %d, want 50 ± 2 %%", seed, len(l), n)
		}
		return l
	}
	first := run(1)
	if again := run(1); !slices.Equal(again, first) {
		t.Errorf("two runs with seed 1 lost different datagrams (%d and %d lost)", len(first), len(again))
	}
	if other := run(2); slices.Equal(other, first) {
		t.Error("seeds 1 and 2 lost the same datagrams")
	}
}

// duplicate 0.5 sends about half the datagrams twice, the copies equal.
func TestFaultUDPDuplicate(t *testing.T) {
	t.Parallel()
	const n = 2000
	sink := startUDPSink(t)
	addrs := faultedProxies(t, 0, v1.ProtocolUDP, sink.conn.LocalAddr().String(),
		`[{"type":"duplicate","stream":"upstream","attributes":{"rate":0.5}}]`)
	got := sendNumbered(t, addrs[0], sink, n)
	times := map[uint32]int{}
	for _, s := range got {
		times[s]++
	}
	dup := 0
	for i := range uint32(n) {
		switch times[i] {
		case 1:
		case 2:
			dup++
		default:
			t.Fatalf("datagram %d arrived %d times, want 1 or 2", i, times[i])
		}
	}
	t.Logf("duplicated %d of %d", dup, n)
	if dup < n*45/100 || dup > n*55/100 {
		t.Fatalf("duplicated %d of %d, want 50 ± 5 %%", dup, n)
	}
}

// reorder 0.3 holds datagrams back past the next one: every datagram
// arrives exactly once, a share of them after their successor.
func TestFaultUDPReorder(t *testing.T) {
	t.Parallel()
	const n = 2000
	sink := startUDPSink(t)
	addrs := faultedProxies(t, 0, v1.ProtocolUDP, sink.conn.LocalAddr().String(),
		`[{"type":"reorder","stream":"upstream","attributes":{"rate":0.3,"delay":50}}]`)
	got := sendNumbered(t, addrs[0], sink, n)
	sorted := slices.Clone(got)
	slices.Sort(sorted)
	for i, s := range sorted {
		if s != uint32(i) {
			t.Fatalf("datagrams received, sorted, diverge at %d (got %d): lost or duplicated", i, s)
		}
	}
	inversions := 0
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			inversions++
		}
	}
	t.Logf("%d of %d datagrams arrived after a later one", inversions, n)
	// Held with 0.3 and released by the next one not held: ≈ n·0.3·0.7.
	if inversions < n*15/100 || inversions > n*30/100 {
		t.Fatalf("%d inversions in %d datagrams, want about 21 %%", inversions, n)
	}
}

// UDP latency delays each datagram by latency ms, either way, also when
// the delay outlasts the session's idle timeout.
func TestFaultUDPLatency(t *testing.T) {
	t.Parallel()
	echo := startUDPEcho(t, "127.0.0.2:0", "")
	for _, stream := range []string{"downstream", "upstream"} {
		t.Run(stream, func(t *testing.T) {
			t.Parallel()
			addrs := faultedProxies(t, 0, v1.ProtocolUDP, echo.LocalAddr().String(), "",
				`[{"type":"latency","stream":"`+stream+`","attributes":{"latency":300}}]`)
			rtt := func(addr string) time.Duration {
				c, err := net.Dial("udp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(3 * time.Second))
				start := time.Now()
				fmt.Fprint(c, "ping")
				if _, err := bufio.NewReader(c).ReadByte(); err != nil {
					t.Fatalf("no answer: %v", err)
				}
				return time.Since(start)
			}
			// The undelayed path's fastest of several: one stalled base
			// sample (55 ms under load) made every delayed one look early
			// (245 ms for 300).
			base := rtt(addrs[0])
			for range samples {
				base = min(base, rtt(addrs[0]))
			}
			measured(t, "latency added", sample(samples, func() time.Duration {
				return rtt(addrs[1]) - base
			}), 300*time.Millisecond, 30*time.Millisecond)
		})
	}
}

// A UDP port's bytes_total counts what was delivered, after the toxics: a
// datagram lost is not proxied, a duplicated one is proxied twice. The
// faulted path counted what came in (a reply lost to every client still
// counted as sent to it; a copy was not counted).
func TestFaultUDPBytesCountDelivered(t *testing.T) {
	echo := loopbackUDPEcho(t)
	p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, nil)})
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP),
		withFaults(`[{"name":"lose","type":"loss","stream":"downstream","attributes":{"rate":1}},`+
			`{"name":"twice","type":"duplicate","stream":"upstream","attributes":{"rate":1}}]`)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, echo.LocalAddr().String()))
	p.Sync()
	c, err := net.Dial("udp", proxyAddr(t, p, "default/dns:p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n, size = 20, 16
	for range n {
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	}
	bytes := func(dir string) float64 {
		m := p.metrics.ports.lookup("default/dns:p")
		if dir == "in" {
			return m.bytesIn.value()
		}
		return m.bytesOut.value()
	}
	waitFor(t, "both copies of every datagram at the backend", func() bool { return bytes("in") == 2*n*size })
	time.Sleep(100 * time.Millisecond) // the echoes, all lost, have come back
	if got := bytes("out"); got != 0 {
		t.Errorf("bytes out %v, want 0: every reply was lost", got)
	}
}

// A datagram a latency toxic delays past --udp-timeout reaches the backend,
// and the session then lives a full --udp-timeout, so the backend's reply
// reaches the client. The expiry re-touched the session only while the
// delay was still ahead: once the datagram left, the session lived 0 to
// --udp-timeout (latency mod timeout), and an expiry check between the
// datagram's due time and the delay line's send closed it first.
func TestFaultUDPLatencyPastIdleTimeout(t *testing.T) {
	t.Parallel()
	// 1 s: the reply (30 ms after the datagram arrives) has 970 ms of
	// slack on a loaded runner (with 200 ms, 2 in 20 loaded runs lost every
	// reply; with 400 ms, 1 run with the package's tests side by side under
	// -race at load 25); 2,000 ms of latency is still a whole multiple,
	// where the old expiry left the session 0 ms.
	const timeout = time.Second
	be, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	var got atomic.Int64
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := be.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			got.Add(1)
			b := append([]byte("re:"), buf[:n]...)
			time.AfterFunc(30*time.Millisecond, func() { _, _ = be.WriteToUDPAddrPort(b, from) })
		}
	}()
	for _, latency := range []int{1990, 2000, 2050} {
		t.Run(strconv.Itoa(latency), func(t *testing.T) {
			p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, nil), UDPIdleTimeout: timeout})
			p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP),
				withFaults(fmt.Sprintf(`[{"name":"lat","type":"latency","stream":"upstream","attributes":{"latency":%d}}]`, latency))))
			p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, be.LocalAddr().String()))
			p.Sync()
			addr := proxyAddr(t, p, "default/dns:p")
			got.Store(0)
			const clients = 20
			var answered atomic.Int64
			var wg sync.WaitGroup
			for i := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := net.Dial("udp", addr)
					if err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					fmt.Fprintf(c, "q%d", i)
					_ = c.SetReadDeadline(time.Now().Add(time.Duration(latency)*time.Millisecond + time.Second))
					buf := make([]byte, 64)
					if n, err := c.Read(buf); err == nil && string(buf[:n]) == fmt.Sprintf("re:q%d", i) {
						answered.Add(1)
					}
				}()
			}
			wg.Wait()
			if got.Load() != clients || answered.Load() != clients {
				t.Errorf("latency %d ms, --udp-timeout %v: the backend got %d of %d datagrams, %d replies came back",
					latency, timeout, got.Load(), clients, answered.Load())
			}
		})
	}
}

// A reply a latency toxic delays past --udp-timeout keeps the session as a
// delayed request does, so the client's next datagram finds its backend:
// the delay a reply's Send returned was ignored and the session closed
// at --udp-timeout, the reply still on its way.
func TestFaultUDPDelayedReplyKeepsSession(t *testing.T) {
	t.Parallel()
	echo := loopbackUDPEcho(t)
	p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, nil), UDPIdleTimeout: 100 * time.Millisecond})
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP),
		withFaults(`[{"name":"lat","type":"latency","stream":"downstream","attributes":{"latency":390}}]`)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, echo.LocalAddr().String()))
	p.Sync()
	c, err := net.Dial("udp", proxyAddr(t, p, "default/dns:p"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprint(c, "q")
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	if _, err := c.Read(buf); err != nil {
		t.Fatalf("no reply: %v", err)
	}
	if n := udpSessions(p, "default/dns:p"); n != 1 {
		t.Errorf("%d sessions when the delayed reply arrived, want 1 (closed while the reply was delayed)", n)
	}
}

// At --udp-max-sessions-per-port, a session whose client's datagram a
// latency toxic still holds is not idle, so it is not the one evicted: its
// datagram reaches the backend and its answer the client, and a new client
// that finds no session to take is dropped, counted. The cap evicted the
// oldest session whatever it held, and the datagram the delay line let out
// later found the session closed and vanished, counted nowhere (4 of 8
// clients were answered, the last 4, 4 counted evicted). A delayed reply
// needs no session (it leaves through the service socket): those sessions
// are evicted as before, and every client is answered (each client sends
// once the reply before it was read, so that its session's reply is in
// the delay line when the cap evicts it, as on the binary with clients
// 2 ms apart, where holding such sessions dropped 40 of 60 new clients).
func TestFaultUDPCapSparesDelayedSessions(t *testing.T) {
	t.Parallel()
	const cap, clients = 4, 8
	for _, tc := range []struct {
		stream           string
		answered         []int
		evicted, dropped int
	}{
		{"upstream", []int{0, 1, 2, 3}, 0, clients - cap},
		{"downstream", []int{0, 1, 2, 3, 4, 5, 6, 7}, clients - cap, 0},
	} {
		t.Run(tc.stream, func(t *testing.T) {
			t.Parallel()
			echo := loopbackUDPEcho(t)
			p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, nil), UDPIdleTimeout: time.Minute,
				UDPMaxSessionsPerPort: cap, UDPMaxSessions: 100})
			// 3 s of latency: the 8 datagrams are sent well within it
			// even on a loaded runner, so every session holds a delayed
			// one when the next client comes.
			p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP),
				withFaults(`[{"name":"lat","type":"latency","stream":"`+tc.stream+`","attributes":{"latency":3000}}]`)))
			p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, echo.LocalAddr().String()))
			p.Sync()
			addr := proxyAddr(t, p, "default/dns:p")
			conns := make([]net.Conn, clients)
			for i := range conns {
				c, err := net.Dial("udp", addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				if _, err := fmt.Fprintf(c, "q%d", i); err != nil {
					t.Fatal(err)
				}
				conns[i] = c
				if tc.stream == "downstream" {
					waitRepliesDelayed(t, p, "default/dns:p", min(i+1, cap))
				}
			}
			var answered []int
			var mu sync.Mutex
			var wg sync.WaitGroup
			for i, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = c.SetReadDeadline(time.Now().Add(8 * time.Second))
					buf := make([]byte, 64)
					if n, err := c.Read(buf); err == nil && string(buf[:n]) == fmt.Sprintf("q%d", i) {
						mu.Lock()
						answered = append(answered, i)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			slices.Sort(answered)
			m := p.metrics.ports.lookup("default/dns:p")
			evicted, dropped := int(m.udpEvicted.value()), int(m.udpDropped.value())
			if !slices.Equal(answered, tc.answered) || evicted != tc.evicted || dropped != tc.dropped {
				t.Errorf("latency %s: clients answered %v, %d evicted, %d dropped; want %v, %d, %d",
					tc.stream, answered, evicted, dropped, tc.answered, tc.evicted, tc.dropped)
			}
		})
	}
}

// waitRepliesDelayed waits until servicePort has n sessions, each of whose
// backend's reply a fault delays (read from the backend, in the delay line).
func waitRepliesDelayed(t *testing.T, p *Proxier, servicePort string, n int) {
	t.Helper()
	p.syncMu.Lock()
	sock := p.active[p.lbName(servicePort)].socket.(*udpProxySocket)
	p.syncMu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); ; {
		sock.mu.Lock()
		delayed := 0
		sock.sessions.each(func(s *udpSession) {
			if s.deferredUntil != 0 {
				delayed++
			}
		})
		sock.mu.Unlock()
		if delayed == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions with a delayed reply after 10 s, want %d", delayed, n)
		}
		time.Sleep(time.Millisecond)
	}
}
