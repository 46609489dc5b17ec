package proxier

import (
	"bufio"
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

func segmentsIn(c net.Conn) uint32 {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return 0
	}
	var info *unix.TCPInfo
	_ = raw.Control(func(fd uintptr) { info, _ = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if info == nil {
		return 0
	}
	return info.Segs_in
}

// On the goroutine relay too, a client's first bytes carry the backend
// dial's handshake ACK (relay.DialControl), and a server that speaks first
// gets it at once (relay.ReleaseHandshakeACK). The event loop's own tests
// are in relay (TestLoop...HandshakeACK, TestLoopServerSpeaksFirst...).
func TestGoroutineRelayHandshakeACK(t *testing.T) {
	var mu sync.Mutex
	var segs []uint32
	requests := serveTCP(t, "127.0.0.2", func(c net.Conn) {
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return
		}
		mu.Lock()
		segs = append(segs, segmentsIn(c))
		mu.Unlock()
		_, _ = c.Write([]byte("ok " + line))
	})
	banners := serveTCP(t, "127.0.0.3", func(c net.Conn) { _, _ = c.Write([]byte("220 banner\n")) })
	// The proxy dials once the test lets it: after the client's request
	// is in (clients, proxy and backends share this process, whose
	// goroutines a loaded machine schedules in any order).
	gate := make(chan struct{}, 1)
	p := newTestProxier(t, Options{DataPath: DataPathGoroutines, Dialer: gatedDialer{backendDialer(relay.Liveness{}), gate}})
	p.OnServiceAdd(makeService("req"))
	p.OnEndpointSliceAdd(makeSlice("req", v1.ProtocolTCP, requests.Addr().String()))
	p.OnServiceAdd(makeService("banner"))
	p.OnEndpointSliceAdd(makeSlice("banner", v1.ProtocolTCP, banners.Addr().String()))
	p.Sync()

	t.Run("client first", func(t *testing.T) {
		addr := proxyAddr(t, p, "default/req:p")
		for range 10 {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write([]byte("GET\n")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond) // on loopback the write is queued on the proxy's side by now
			gate <- struct{}{}
			if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ok GET") {
				t.Fatalf("answer %q, %v", line, err)
			}
			c.Close()
		}
		mu.Lock()
		defer mu.Unlock()
		for _, n := range segs {
			if n != 2 {
				t.Fatalf("segments the backend received per connection before the request was read: %v; want 2 each (SYN, request with the ACK)", segs)
			}
		}
	})
	t.Run("server first", func(t *testing.T) {
		addr := proxyAddr(t, p, "default/banner:p")
		fastest := time.Hour
		for range 3 {
			start := time.Now()
			gate <- struct{}{} // nothing to wait for: the client sends nothing
			line, err := askName(t, "127.0.0.1", addr)
			if err != nil || line != "220 banner" {
				t.Fatalf("banner %q, %v", line, err)
			}
			fastest = min(fastest, time.Since(start))
		}
		if fastest >= 150*time.Millisecond {
			t.Fatalf("the fastest of 3 server-first connections took %v to its banner: the handshake's ACK waited for the delayed-ACK timer", fastest)
		}
	})
}

// gatedDialer dials through d once gate lets it.
type gatedDialer struct {
	d    Dialer
	gate chan struct{}
}

func (g gatedDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	<-g.gate
	// The attempt's bound (250 ms for the first) is the dial's, not the
	// gate's: a loaded runner let the test's token come after it, the
	// attempt failed at once, and the next waited for a token that never
	// came (and took the next connection's): every connection hung.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return g.d.DialContext(ctx, network, address)
}

// A backend with Nagle on (most not written in Go) that answers in two
// writes gets the ACK of the first at once through every path a
// connection can take: the event loop, the goroutine relay, and a faulted
// connection's pipelines. The held handshake ACK left the backend socket
// in delayed-ACK mode, and every connection's first answer came 40 ms
// late; a faulted connection's too, whose copies never took it out.
func TestNagleBackendAnsweredAtOnce(t *testing.T) {
	backend := serveTCP(t, "127.0.0.2", func(c net.Conn) {
		_ = c.(*net.TCPConn).SetNoDelay(false)
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			return
		}
		_, _ = c.Write([]byte("HTTP/1.0 200 OK\r\n\r\n"))
		_, _ = c.Write([]byte("body\n"))
	})
	for _, path := range []string{DataPathEventLoop, DataPathGoroutines} {
		t.Run(path, func(t *testing.T) {
			p := newTestProxier(t, Options{DataPath: path})
			p.OnServiceAdd(makeService("plain"))
			p.OnEndpointSliceAdd(makeSlice("plain", v1.ProtocolTCP, backend.Addr().String()))
			p.OnServiceAdd(makeService("faulted", withClusterIP("10.96.0.11"),
				withFaults(`[{"type":"bandwidth","stream":"upstream","attributes":{"rate":1000000}}]`)))
			p.OnEndpointSliceAdd(makeSlice("faulted", v1.ProtocolTCP, backend.Addr().String()))
			p.Sync()
			for _, svc := range []string{"plain", "faulted"} {
				addr := proxyAddr(t, p, "default/"+svc+":p")
				var took []time.Duration
				for range 5 {
					c := dialTCP(t, addr)
					start := time.Now()
					if _, err := c.Write([]byte("GET /\n")); err != nil {
						t.Fatal(err)
					}
					r := bufio.NewReader(c)
					if _, err := r.ReadString('\n'); err != nil {
						t.Fatal(err)
					}
					if line, err := r.ReadString('\n'); err != nil || line != "\r\n" {
						t.Fatalf("%s: %q, %v", svc, line, err)
					}
					if line, err := r.ReadString('\n'); err != nil || line != "body\n" {
						t.Fatalf("%s: %q, %v", svc, line, err)
					}
					took = append(took, time.Since(start))
					c.Close()
				}
				// The delayed ACK held every connection's answer 40 ms; a
				// loaded runner holds one of them now and then, so the
				// median judges.
				slices.Sort(took)
				t.Logf("%s: answers took %v", svc, took)
				if took[2] > 25*time.Millisecond {
					t.Errorf("%s: answers took %v, the median over 25 ms: the proxy delayed the ACK of the answer's first write", svc, took)
				}
			}
		})
	}
}
