package proxier

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// portBytes reads kubeproxy_userspace_bytes_total of one service port off a
// scrape: in (client to endpoint) and out.
func portBytes(t *testing.T, p *Proxier, servicePort string) (in, out float64) {
	t.Helper()
	mfs, err := p.metrics.Registry.Gather()
	if err != nil {
		t.Error(err)
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "kubeproxy_userspace_bytes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var port, dir string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "service_port":
					port = l.GetValue()
				case "direction":
					dir = l.GetValue()
				}
			}
			if port != servicePort {
				continue
			}
			if dir == "in" {
				in = m.GetCounter().GetValue()
			} else {
				out = m.GetCounter().GetValue()
			}
		}
	}
	return in, out
}

// echoProxier is a proxier of each data path's serving default/web:p with
// an echo backend.
func echoProxier(t *testing.T, dataPath string) *Proxier {
	t.Helper()
	backend := serveTCP(t, "127.0.0.1", func(c net.Conn) { io.Copy(c, c) })
	p := newTestProxier(t, Options{DataPath: dataPath})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend.Addr().String()))
	p.Sync()
	return p
}

// echo writes n bytes on c and reads them back.
func echo(t *testing.T, c net.Conn, n int) {
	t.Helper()
	if _, err := c.Write(make([]byte, n)); err != nil {
		t.Error(err)
		return
	}
	if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
		t.Error(err)
	}
}

// waitBytes scrapes until the port's bytes_total reads in and out (a
// reading may trail the client's by the moment the relay takes to see its
// own end), or fails with the last reading.
func waitBytes(t *testing.T, p *Proxier, step string, in, out float64) {
	t.Helper()
	var gotIn, gotOut float64
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if gotIn, gotOut = portBytes(t, p, "default/web:p"); gotIn == in && gotOut == out {
			return
		}
	}
	t.Fatalf("%s: bytes_total in %v, out %v; want %v, %v", step, gotIn, gotOut, in, out)
}

// A long-lived connection's bytes reach kubeproxy_userspace_bytes_total
// while it moves them (a dashboard's rate() of a gRPC or websocket stream
// is not zero until a spike at its close), on both data paths, and its end
// adds only what the scrapes did not count: the total is the bytes moved,
// once.
func TestBytesTotalCountsLiveConnections(t *testing.T) {
	for _, dataPath := range []string{DataPathGoroutines, DataPathEventLoop} {
		t.Run(dataPath, func(t *testing.T) {
			p := echoProxier(t, dataPath)
			c, err := net.DialTimeout("tcp", proxyAddr(t, p, "default/web:p"), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			echo(t, c, 1000)
			waitBytes(t, p, "open, 1000 bytes echoed", 1000, 1000)
			echo(t, c, 250000) // a bulk stretch: spliced, on either path
			waitBytes(t, p, "open, 251000 bytes echoed", 251000, 251000)
			echo(t, c, 5000) // left for the end to add
			c.Close()
			waitBytes(t, p, "closed", 256000, 256000)
			time.Sleep(100 * time.Millisecond) // an end counted late would show now
			if in, out := portBytes(t, p, "default/web:p"); in != 256000 || out != 256000 {
				t.Fatalf("after the end: in %v, out %v; want 256000 each (counted once)", in, out)
			}
		})
	}
}

// kubeproxy_userspace_bytes_total never goes down (Prometheus reads a
// counter that does as a reset) and counts each byte once while
// connections end between and during scrapes, with a FIN or a reset.
func TestBytesTotalMonotonicWhileConnectionsEnd(t *testing.T) {
	for _, dataPath := range []string{DataPathGoroutines, DataPathEventLoop} {
		t.Run(dataPath, func(t *testing.T) {
			p := echoProxier(t, dataPath)
			addr := proxyAddr(t, p, "default/web:p")
			stop := make(chan struct{})
			scraped := make(chan error, 1)
			go func() {
				var lastIn, lastOut float64
				for n := 0; ; n++ {
					select {
					case <-stop:
						scraped <- nil
						return
					default:
					}
					in, out := portBytes(t, p, "default/web:p")
					if in < lastIn || out < lastOut {
						scraped <- fmt.Errorf("scrape %d: in %v, out %v after in %v, out %v", n, in, out, lastIn, lastOut)
						return
					}
					lastIn, lastOut = in, out
				}
			}()
			const conns, rounds, size = 20, 5, 7000
			var wg sync.WaitGroup
			for i := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := net.DialTimeout("tcp", addr, 2*time.Second)
					if err != nil {
						t.Error(err)
						return
					}
					for range rounds {
						echo(t, c, size)
						time.Sleep(time.Millisecond)
					}
					if i%2 == 1 {
						_ = c.(*net.TCPConn).SetLinger(0) // a reset, once all came back
					}
					c.Close()
				}()
			}
			wg.Wait()
			want := float64(conns * rounds * size)
			waitBytes(t, p, "all ended", want, want)
			close(stop)
			if err := <-scraped; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A direction's count reaches its port once: what scrapes flush of its
// live readings, and at its end what they left, never less than what was
// already passed on (a reading may exceed the final count when a reset
// drops bytes received), nothing after the end.
func TestByteCountFlush(t *testing.T) {
	type step struct {
		flush, end int64 // a scrape's live reading (flush) or the final count (end); -1: none
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  float64
	}{
		{"only the end", []step{{-1, 500}}, 500},
		{"flushed, then the rest at the end", []step{{100, -1}, {300, -1}, {-1, 500}}, 500},
		{"a lower reading adds nothing", []step{{300, -1}, {200, -1}, {-1, 300}}, 300},
		{"a reading above the final count stays", []step{{400, -1}, {-1, 350}}, 400},
		{"nothing flushed after the end", []step{{100, -1}, {-1, 200}, {900, -1}}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var port counter
			b := byteCount{port: &port}
			for _, s := range tc.steps {
				if s.flush >= 0 {
					b.flush(s.flush)
				} else {
					b.Add(float64(s.end))
				}
			}
			if got := port.value(); got != tc.want {
				t.Fatalf("port counter %v, want %v", got, tc.want)
			}
		})
	}
}

// A direction a toxic acts on counts in bytes_total what its toxics passed
// on, also while it runs: a scrape read the kernel's bytes received, which
// has what a blackhole dropped, and no end takes it back, so two runs that
// differed only in when Prometheus scraped reported 0 and 50000. A latency
// toxic's stream still counts while it runs.
func TestBytesTotalCountsWhatAToxicPassedOn(t *testing.T) {
	const size = 50000
	for _, tc := range []struct {
		name, toxic string
		relayed     float64
	}{
		{"timeout drops it all", `{"type":"timeout","stream":"upstream","attributes":{"timeout":600}}`, 0},
		{"reset_peer drops it all", `{"type":"reset_peer","stream":"upstream","attributes":{"timeout":600}}`, 0},
		{"latency passes it on", `{"type":"latency","stream":"upstream","attributes":{"latency":50}}`, size},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			backend := serveTCP(t, "127.0.0.1", func(c net.Conn) { io.Copy(io.Discard, c) })
			p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, nil)})
			p.OnServiceAdd(makeService("web", withProtocol(v1.ProtocolTCP), withFaults("["+tc.toxic+"]")))
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend.Addr().String()))
			p.Sync()
			c, err := net.DialTimeout("tcp", proxyAddr(t, p, "default/web:p"), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(make([]byte, size)); err != nil {
				t.Fatal(err)
			}
			if tc.relayed > 0 {
				waitBytes(t, p, "open", tc.relayed, 0) // counted while it runs
				c.Close()
			} else {
				time.Sleep(200 * time.Millisecond)
				in, _ := portBytes(t, p, "default/web:p") // a scrape while it runs
				t.Logf("scraped while open: in %v", in)
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, _ = io.ReadAll(c) // the toxic ends it
			}
			waitBytes(t, p, "ended", tc.relayed, 0)
			time.Sleep(100 * time.Millisecond) // an end counted late would show now
			if in, _ := portBytes(t, p, "default/web:p"); in != tc.relayed {
				t.Fatalf("after the end: bytes_total{in} %v, want %v", in, tc.relayed)
			}
		})
	}
}
