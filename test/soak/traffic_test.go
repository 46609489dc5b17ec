package soak

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// load is the traffic of one run: clients in pod1 (whose addresses all stay
// up) and vanishing clients in pod2 (one address cut per vanish).
type load struct {
	c     *netns.Cluster
	svcs  *services
	n     int // Services
	stats *tallies
	seeds atomic.Uint64

	until       time.Time // no connection is planned to outlive it
	vanishEvery time.Duration
	vanished    atomic.Int64 // pod2 addresses cut
}

// client picks a pod1 source address and a Service.
func (l *load) pick(rng *rand.Rand) (netip.Addr, int) {
	return l.c.Pod1IPs[rng.IntN(len(l.c.Pod1IPs))], rng.IntN(l.n)
}

// run starts every worker; they stop when ctx ends, and run returns when
// all have finished their current connection.
func (l *load) run(ctx context.Context) {
	var wg sync.WaitGroup
	spawn := func(workers int, f func(ctx context.Context, rng *rand.Rand)) {
		for range workers {
			seed := l.seeds.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				f(ctx, rand.New(rand.NewPCG(seed, 0x5eed)))
			}()
		}
	}
	spawn(3, l.newConns)
	spawn(1, l.halfClosed)
	spawn(16, l.keptAlive)
	spawn(2, l.longStreams)
	spawn(2, l.udpQueries)
	spawn(1, l.vanishing)
	wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// tcp runs one echo connection of kind: body gets the connection after the
// greeting and returns the bytes verified.
func (l *load) tcp(kind string, ns *netns.NS, src netip.Addr, svc int, life time.Duration, body func(*conn) (int64, error)) {
	cn, err := dialEcho(ns, src, l.svcs, svc, time.Now().Add(life+30*time.Second))
	if err != nil {
		l.stats.end(kind, 0, err, false, fmt.Sprintf("%s -> s%02d", src, svc))
		return
	}
	defer cn.c.Close()
	n, err := body(cn)
	l.stats.end(kind, n, err, err != nil && cn.removedMeanwhile(l.svcs), cn.String())
}

// newConns: a fresh connection per request, 1-32 KiB echoed, closed by a
// half-close; as many as they go, 50 ms apart.
func (l *load) newConns(ctx context.Context, rng *rand.Rand) {
	for sleepCtx(ctx, 50*time.Millisecond) {
		src, svc := l.pick(rng)
		size := int64(1<<10 + rng.IntN(31<<10))
		seed := l.seeds.Add(1)
		l.tcp(kindNew, l.c.Pod1, src, svc, 0, func(cn *conn) (int64, error) {
			return cn.streamEcho(seed, size, 16<<10, 0, 16<<10, 0)
		})
	}
}

// halfClosed: the client sends 512 KiB and half-closes at once while it reads
// the echo slowly (32 KiB per 100 ms), so the backend keeps sending for
// about a second and a half after the client's FIN.
func (l *load) halfClosed(ctx context.Context, rng *rand.Rand) {
	for sleepCtx(ctx, 200*time.Millisecond) {
		src, svc := l.pick(rng)
		seed := l.seeds.Add(1)
		l.tcp(kindHalfClose, l.c.Pod1, src, svc, 10*time.Second, func(cn *conn) (int64, error) {
			return cn.streamEcho(seed, 512<<10, 64<<10, 0, 32<<10, 100*time.Millisecond)
		})
	}
}

// keptAlive: a connection that lives 10-60 s, exchanging a 16-256 byte
// message every 0.2-1 s, then closes cleanly.
func (l *load) keptAlive(ctx context.Context, rng *rand.Rand) {
	for sleepCtx(ctx, time.Duration(rng.IntN(1000))*time.Millisecond) {
		src, svc := l.pick(rng)
		life := min(10*time.Second+time.Duration(rng.IntN(50))*time.Second, time.Until(l.until))
		seed := l.seeds.Add(1)
		l.tcp(kindKeepAlive, l.c.Pod1, src, svc, life, func(cn *conn) (int64, error) {
			gen := pattern(seed)
			var verified int64
			end := time.Now().Add(life)
			for time.Now().Before(end) && ctx.Err() == nil {
				size := 16 + rng.IntN(240)
				msg, want := make([]byte, size), make([]byte, size)
				if err := cn.exchange(gen, msg, want); err != nil {
					return verified, err
				}
				verified += int64(size)
				time.Sleep(200*time.Millisecond + time.Duration(rng.IntN(800))*time.Millisecond)
			}
			return verified, cn.closeClean()
		})
	}
}

// longStreams: 20-60 s at 1 MiB/s (64 KiB every 62.5 ms) each way.
func (l *load) longStreams(ctx context.Context, rng *rand.Rand) {
	for sleepCtx(ctx, 100*time.Millisecond) {
		src, svc := l.pick(rng)
		secs := min(20+rng.IntN(41), int(time.Until(l.until)/time.Second))
		if secs < 1 {
			sleepCtx(ctx, time.Until(l.until))
			continue
		}
		seed := l.seeds.Add(1)
		l.tcp(kindStream, l.c.Pod1, src, svc, time.Duration(secs)*time.Second, func(cn *conn) (int64, error) {
			return cn.streamEcho(seed, int64(secs)<<20, 64<<10, 62500*time.Microsecond, 64<<10, 0)
		})
	}
}

// udpQueries: one query per fresh socket (a new source port each time, as
// DNS clients do), "ECHO" plus 16-1024 random bytes, which must come back
// after the backend's "NAME REMOTE\n".
func (l *load) udpQueries(ctx context.Context, rng *rand.Rand) {
	for sleepCtx(ctx, 25*time.Millisecond) {
		src, svc := l.pick(rng)
		q := append([]byte("ECHO"), make([]byte, 16+rng.IntN(1009))...)
		_, _ = pattern(l.seeds.Add(1)).Read(q[4:])
		n, err := l.udpQuery(src, svc, q)
		l.stats.end(kindUDP, n, err, false, fmt.Sprintf("%s -> %s:%d", src, clusterIP(svc), udpPort))
	}
}

func (l *load) udpQuery(src netip.Addr, svc int, q []byte) (int64, error) {
	c, err := l.c.Pod1.ListenUDP(src)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer c.Close()
	dst := netip.AddrPortFrom(clusterIP(svc), udpPort)
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.WriteToUDPAddrPort(q, dst); err != nil {
		return 0, fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 4096)
	k, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		return 0, fmt.Errorf("no reply: %w", err)
	}
	if from != dst {
		return 0, fmt.Errorf("reply from %s: %w", from, errCorrupt)
	}
	i := bytes.IndexByte(buf[:k], '\n')
	if i < 0 || !bytes.Equal(buf[i+1:k], q) {
		return 0, fmt.Errorf("reply %q...: %w", buf[:min(k, 40)], errCorrupt)
	}
	return int64(len(q)), nil
}

// vanishing: every vanishEvery, two kept-alive connections from the next
// pod2 address exchange one message each; then the address's packets are
// dropped both ways inside pod2 and the sockets closed, so their FINs never
// leave: to the proxy the client host is simply gone, as when a node dies or
// its link is cut. The address is never used again.
func (l *load) vanishing(ctx context.Context, rng *rand.Rand) {
	next := 1 // Pod2IPs[0] stays a normal address
	for sleepCtx(ctx, l.vanishEvery) && next < len(l.c.Pod2IPs) {
		src := l.c.Pod2IPs[next]
		next++
		var conns []*conn
		for range 2 {
			svc := rng.IntN(l.n)
			cn, err := dialEcho(l.c.Pod2, src, l.svcs, svc, time.Now().Add(30*time.Second))
			if err != nil {
				l.stats.end(kindVanish, 0, err, false, fmt.Sprintf("%s -> s%02d", src, svc))
				continue
			}
			size := 16 + rng.IntN(240)
			msg, want := make([]byte, size), make([]byte, size)
			if err := cn.exchange(pattern(l.seeds.Add(1)), msg, want); err != nil {
				l.stats.end(kindVanish, 0, err, cn.removedMeanwhile(l.svcs), cn.String())
				cn.c.Close()
				continue
			}
			l.stats.end(kindVanish, int64(size), nil, false, cn.String())
			conns = append(conns, cn)
		}
		s := src.String()
		if _, err := l.c.Pod2.Exec("iptables", "-w", "-I", "OUTPUT", "-s", s, "-j", "DROP"); err != nil {
			l.stats.end(kindVanish, 0, err, false, "cut "+s)
		}
		if _, err := l.c.Pod2.Exec("iptables", "-w", "-I", "INPUT", "-d", s, "-j", "DROP"); err != nil {
			l.stats.end(kindVanish, 0, err, false, "cut "+s)
		}
		for _, cn := range conns {
			cn.c.Close()
		}
		l.vanished.Add(1)
	}
}
