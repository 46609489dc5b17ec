package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

const (
	ageClients   = 40
	maxAge       = 3 * time.Second
	closeQuiet   = 300 * time.Millisecond
	pingInterval = time.Second
)

// TestMaxConnectionAgeRebalances: 40 kept-alive clients of a Service with
// two endpoints, which then scales to four. With the Service's
// kube-userspace-proxy/max-connection-age each connection is closed (FIN)
// at its first quiet moment past the age, the clients reconnect, and
// within age + quiet time every endpoint carries 8-12 of them; a Service
// without the annotation keeps all 40 on the first two (as every
// kube-proxy mode does). No request is cut: a client that sent a request
// always gets its answer.
func TestMaxConnectionAgeRebalances(t *testing.T) {
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 4, ClientIPsEach: 4})
	c.StartBackends(t, backendBin, backendPort)
	p := newProxy(t, c, "--connection-close-quiet="+closeQuiet.String())
	aged := svc{name: "aged", clusterIP: "10.96.8.10", endpoints: ips(c, 0, 1),
		annotations: map[string]string{"kube-userspace-proxy/max-connection-age": maxAge.String()}}
	plain := svc{name: "plain", clusterIP: "10.96.8.11", endpoints: ips(c, 0, 1)}
	writeSvc(t, p.dir, aged)
	writeSvc(t, p.dir, plain)
	p.Start(t, startWithin)
	probe := e2ePod1(c, 3)
	probe.WaitServed(t, "tcp", aged.tcp(), time.Now(), startBudget)
	probe.WaitServed(t, "tcp", plain.tcp(), time.Now(), startBudget)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	agedPool := startPool(ctx, c.Pod1, c.Pod1IPs[0], aged.tcp(), ageClients)
	plainPool := startPool(ctx, c.Pod1, c.Pod1IPs[1], plain.tcp(), ageClients)
	for _, pool := range []*pool{agedPool, plainPool} {
		if !pool.waitAll(10 * time.Second) {
			t.Fatalf("only %v of %d clients connected", pool.counts(), ageClients)
		}
	}
	t.Logf("before the scale-up: aged %v, plain %v", agedPool.counts(), plainPool.counts())

	aged.endpoints, plain.endpoints = ips(c, 0, 1, 2, 3), ips(c, 0, 1, 2, 3)
	scaled := time.Now()
	writeSvc(t, p.dir, aged)
	writeSvc(t, p.dir, plain)

	// Every connection made before the scale-up is at most a few seconds
	// old, so each is past the age within maxAge, and quiet within a ping
	// interval more; the manifest reload and reconnects take well under
	// a second.
	budget := maxAge + closeQuiet + pingInterval + 2*time.Second
	var counts map[string]int
	for {
		counts = agedPool.counts()
		if spread(counts, c, 8, 12) {
			break
		}
		if time.Since(scaled) > budget {
			t.Fatalf("aged: %v %v after the scale-up; want 8-12 on each of the 4 endpoints", counts, budget)
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(scaled)
	figure(t, "max-connection-age %v, quiet %v: %d kept-alive clients spread %v over 4 endpoints %v after the scale-up from 2 (%d reconnects)",
		maxAge, closeQuiet, ageClients, sorted(counts), took.Round(100*time.Millisecond), agedPool.reconnects.Load())
	pc := plainPool.counts()
	figure(t, "without the annotation: %v", sorted(pc))
	if pc[c.BackendIPs[2].String()]+pc[c.BackendIPs[3].String()] != 0 {
		t.Errorf("plain Service: %v; its connections should never move", pc)
	}
	stop()
	agedPool.wg.Wait()
	plainPool.wg.Wait()
	agedPool.checkCuts(t, "aged", maxCrossed)
	plainPool.checkCuts(t, "plain", 0)
}

// TestMaxConnectionAgeBusyPool: 9 kept-alive clients that send a request
// every 200 ms, never quiet for the 300 ms quiet time, all on one endpoint
// of a Service with a 3 s max age, which then gets two more. Each
// connection is closed at the close deadline (1 s) past its age all the
// same, and the pool spreads 3/3/3 (it stayed 9/0/0 while a close waited
// for a quiet moment that never came).
func TestMaxConnectionAgeBusyPool(t *testing.T) {
	requireSuite(t)
	const (
		clients  = 9
		every    = 200 * time.Millisecond
		deadline = time.Second
	)
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 3, ClientIPsEach: 1})
	c.StartBackends(t, backendBin, backendPort)
	p := newProxy(t, c, "--connection-close-quiet="+closeQuiet.String(), "--connection-close-deadline="+deadline.String())
	busy := svc{name: "busy", clusterIP: "10.96.8.30", endpoints: ips(c, 0),
		annotations: map[string]string{"kube-userspace-proxy/max-connection-age": maxAge.String()}}
	writeSvc(t, p.dir, busy)
	p.Start(t, startWithin)
	e2ePod1(c, 0).WaitServed(t, "tcp", busy.tcp(), time.Now(), startBudget)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pool := startPoolEvery(ctx, c.Pod1, c.Pod1IPs[0], busy.tcp(), clients, every)
	if !pool.waitAll(10 * time.Second) {
		t.Fatalf("only %v of %d clients connected", pool.counts(), clients)
	}
	busy.endpoints = ips(c, 0, 1, 2)
	scaled := time.Now()
	writeSvc(t, p.dir, busy)
	budget := maxAge + deadline + 2*time.Second
	var counts map[string]int
	for counts = pool.counts(); !spread(counts, c, 2, 4); counts = pool.counts() {
		if time.Since(scaled) > budget {
			t.Fatalf("busy pool: %v %v after the scale-up; want 2-4 on each of the 3 endpoints", counts, budget)
		}
		time.Sleep(100 * time.Millisecond)
	}
	figure(t, "max-connection-age %v, quiet %v, close deadline %v: %d clients sending every %v spread %v over 3 endpoints %v after the scale-up from 1",
		maxAge, closeQuiet, deadline, clients, every, sorted(counts), time.Since(scaled).Round(100*time.Millisecond))
	stop()
	pool.wg.Wait()
	// A close at a busy moment may meet a request on the wire (each
	// connection once at most); none may get half an answer or none at
	// all without the connection's end.
	pool.checkCuts(t, "busy", clients)
}

// TestDrainRemoved: 40 kept-alive clients of a Service with
// kube-userspace-proxy/drain-removed over two endpoints; one is removed
// from the Service (its backend keeps running, as a pod that is being
// replaced does), and within the drain time plus a quiet moment every
// connection is on the remaining endpoint, none cut mid-request.
func TestDrainRemoved(t *testing.T) {
	requireSuite(t)
	const drain = time.Second
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 2, ClientIPsEach: 4})
	c.StartBackends(t, backendBin, backendPort)
	p := newProxy(t, c, "--connection-close-quiet="+closeQuiet.String())
	drained := svc{name: "drained", clusterIP: "10.96.8.20", endpoints: ips(c, 0, 1),
		annotations: map[string]string{"kube-userspace-proxy/drain-removed": drain.String()}}
	writeSvc(t, p.dir, drained)
	p.Start(t, startWithin)
	e2ePod1(c, 3).WaitServed(t, "tcp", drained.tcp(), time.Now(), startBudget)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	clients := startPool(ctx, c.Pod1, c.Pod1IPs[0], drained.tcp(), ageClients)
	if !clients.waitAll(10 * time.Second) {
		t.Fatalf("only %v of %d clients connected", clients.counts(), ageClients)
	}
	before := clients.counts()
	drained.endpoints = ips(c, 0)
	removed := time.Now()
	writeSvc(t, p.dir, drained)
	gone := c.BackendIPs[1].String()
	budget := drain + closeQuiet + pingInterval + 2*time.Second
	for clients.counts()[gone] > 0 || clients.counts()[c.BackendIPs[0].String()] != ageClients {
		if time.Since(removed) > budget {
			t.Fatalf("%v %v after %s left the Service (drain %v)", clients.counts(), budget, gone, drain)
		}
		time.Sleep(50 * time.Millisecond)
	}
	figure(t, "drain-removed %v, quiet %v: %v -> %s on the remaining endpoint %v after the other left",
		drain, closeQuiet, sorted(before), sorted(clients.counts()), time.Since(removed).Round(100*time.Millisecond))
	stop()
	clients.wg.Wait()
	clients.checkCuts(t, "drained", maxCrossed)
}

func e2ePod1(c *netns.Cluster, i int) interface {
	WaitServed(t testing.TB, proto string, dst netip.AddrPort, since time.Time, within time.Duration) time.Duration
} {
	return (&env{c: c}).pod1(i)
}

// spread reports whether each backend carries lo..hi connections.
func spread(counts map[string]int, c *netns.Cluster, lo, hi int) bool {
	for _, b := range c.BackendIPs {
		if n := counts[b.String()]; n < lo || n > hi {
			return false
		}
	}
	return true
}

func sorted(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s:%d", k, counts[k]))
	}
	return strings.Join(parts, " ")
}

// pool is n clients that each keep one connection to a Service, send a
// request every pingInterval and reconnect when the proxy closes it, as
// an HTTP client's keep-alive pool does: a connection found closed (a FIN
// waiting) before a request is replaced without sending on it.
type pool struct {
	mu         sync.Mutex
	backend    []string // per client: the backend IP its connection reached; "" = none
	reconnects atomic.Int64
	cut        atomic.Int64 // requests sent that got no answer
	firstCut   atomic.Value
	// crossed counts requests that met the connection already closed (an
	// end of stream or a reset before any byte of the answer): the close
	// and the request crossed on the wire, the race every keep-alive pool
	// has and HTTP clients meet by retrying on a new connection. A close
	// at a quiet moment makes it rare; checkCuts bounds it.
	crossed atomic.Int64
	wg      sync.WaitGroup
	// every is the time between a client's requests.
	every time.Duration
}

func startPool(ctx context.Context, ns *netns.NS, src netip.Addr, dst netip.AddrPort, n int) *pool {
	return startPoolEvery(ctx, ns, src, dst, n, pingInterval)
}

// startPoolEvery is startPool with a request every interval.
func startPoolEvery(ctx context.Context, ns *netns.NS, src netip.Addr, dst netip.AddrPort, n int, every time.Duration) *pool {
	p := &pool{backend: make([]string, n), every: every}
	for i := range n {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.client(ctx, ns, src, dst, i)
		}()
	}
	return p
}

func (p *pool) set(i int, b string) {
	p.mu.Lock()
	p.backend[i] = b
	p.mu.Unlock()
}

func (p *pool) counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]int{}
	for _, b := range p.backend {
		if b != "" {
			m[b]++
		}
	}
	return m
}

func (p *pool) waitAll(within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		total := 0
		for _, n := range p.counts() {
			total += n
		}
		if total == len(p.backend) {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func (p *pool) client(ctx context.Context, ns *netns.NS, src netip.Addr, dst netip.AddrPort, i int) {
	first := true
	for ctx.Err() == nil {
		if !first {
			p.reconnects.Add(1)
		}
		first = false
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := ns.DialTCP(dctx, src, dst)
		cancel()
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		p.session(ctx, conn, i)
		p.set(i, "")
		conn.Close()
	}
}

// session greets the backend (ECHO: it answers "NAME REMOTE" and echoes
// from then on), records which endpoint it reached, and pings until the
// connection is closed or ctx ends.
func (p *pool) session(ctx context.Context, conn *net.TCPConn, i int) {
	r := bufio.NewReader(conn)
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := conn.Write([]byte("ECHO\n")); err != nil {
		return
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	// The backend's name is bN; its address is what the counts are by.
	name := strings.Fields(line)[0]
	p.set(i, backendAddr(name))
	ping := []byte("ping\n")
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.every):
		}
		// A pool looks before it reuses: a FIN already here means the
		// connection is done.
		_ = conn.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, err := r.Peek(1); errors.Is(err, io.EOF) {
			return
		}
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := conn.Write(ping); err != nil {
			p.noteFailed(err, 0)
			return
		}
		got := make([]byte, len(ping))
		if n, err := io.ReadFull(r, got); err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) || ctx.Err() == nil {
				p.noteFailed(err, n)
			}
			return
		}
	}
}

// noteFailed sorts a request that got no full answer (n bytes of it):
// one that found the connection closed before any answer crossed the
// close; anything else (a timeout, half an answer) was cut.
func (p *pool) noteFailed(err error, n int) {
	closed := errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
	if n == 0 && closed {
		p.crossed.Add(1)
		return
	}
	p.cut.Add(1)
	p.firstCut.CompareAndSwap(nil, err.Error())
}

// maxCrossed is how many requests of a pool's run may cross a close: a
// close at a quiet moment leaves a ping interval minus the quiet time
// before the next request, so only a close delayed that long by the
// machine crosses one; a proxy closing at busy moments crosses many.
const maxCrossed = 2

// checkCuts fails the test for any cut request, or for more crossed
// closes than maxCross (maxCrossed where the proxy closes connections, 0
// where it must not).
func (p *pool) checkCuts(t *testing.T, name string, maxCross int64) {
	t.Helper()
	if n := p.cut.Load(); n > 0 {
		t.Errorf("%s: %d requests got no answer (first: %v); a close at a quiet moment must cut none", name, n, p.firstCut.Load())
	}
	if n := p.crossed.Load(); n > maxCross {
		t.Errorf("%s: %d requests met a closed connection (at most %d may cross a close here)", name, n, maxCross)
	} else if n > 0 {
		t.Logf("%s: %d request(s) crossed a close and would be retried, as HTTP clients do", name, n)
	}
}

// backendAddr maps the backend names StartBackends gives (b1, b2, ...) to
// the 4-backend cluster's addresses.
func backendAddr(name string) string {
	var n int
	if _, err := fmt.Sscanf(name, "b%d", &n); err != nil {
		return name
	}
	return fmt.Sprintf("10.77.1.%d", 10+n)
}
