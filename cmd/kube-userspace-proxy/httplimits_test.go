package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
)

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	return len(ents)
}

// TestHealthServerIdleTimeoutAndCap is issue 9's scenario: 200 keep-alive
// connections each make one GET /livez and then say nothing. The process
// never holds more than the cap of server-side descriptors (the client side
// of the 200 lives in this process too and is counted apart): at the cap a
// new client takes the place of the longest-idle connection, which the
// server closes, and the last ones in are closed at the idle timeout. So
// every client is answered, none waiting for an idle timeout.
func TestHealthServerIdleTimeoutAndCap(t *testing.T) {
	const (
		clients = 200
		maxConn = 40
		idle    = 400 * time.Millisecond
	)
	o := newOptions()
	o.healthzBindAddress = net.JoinHostPort("127.0.0.1", freePortString(t))
	o.metricsBindAddress = ""
	o.httpMaxConns = maxConn
	o.httpIdleTimeout = idle
	health := healthcheck.NewProxierHealth(clock.RealClock{}, time.Minute)
	servers, _, err := startServers(t.Context(), o, nil, health, proxier.NewMetrics(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			_ = s.Close()
		}
	})

	base := openFDs(t)
	var peak atomic.Int64
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			peak.Store(max(peak.Load(), int64(openFDs(t)-base)))
			select {
			case <-stopSampling:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})

	type result struct {
		heldOpen time.Duration // from the response to the server's close
		err      error
	}
	results := make(chan result, clients)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", o.healthzBindAddress, 10*time.Second)
			if err != nil {
				results <- result{err: err}
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: node\r\n\r\n"); err != nil {
				results <- result{err: err}
				return
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				results <- result{err: err}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Close {
				results <- result{err: errors.New("the server did not keep the connection alive")}
				return
			}
			answered := time.Now()
			// Idle from here on: only the server's idle timeout ends it.
			_, err = br.ReadByte()
			if !errors.Is(err, io.EOF) {
				results <- result{err: errors.New("connection not closed by the server: " + err.Error())}
				return
			}
			results <- result{heldOpen: time.Since(answered)}
		})
	}
	wg.Wait()
	close(stopSampling)
	sampler.Wait()
	close(results)

	var held []time.Duration
	for r := range results {
		if r.err != nil {
			t.Errorf("client: %v", r.err)
			continue
		}
		held = append(held, r.heldOpen)
	}
	// A client may read its response late on a loaded machine, so only the
	// upper bound is checked per connection; the median shows the idle
	// timeout (not something earlier) closed them.
	slices.Sort(held)
	for _, h := range held {
		if h > idle+10*time.Second {
			t.Errorf("an idle connection was closed %v after its response, want about the idle timeout %v", h, idle)
			break
		}
	}
	atIdle := 0
	for _, h := range held {
		if h >= idle/2 {
			atIdle++
		}
	}
	if atIdle < maxConn/2 {
		t.Errorf("%d connections were held to about the idle timeout %v, want at least %d (the last ones in, which no one displaced)", atIdle, idle, maxConn/2)
	}
	// Each client holds one descriptor of its own; the server may hold at
	// most maxConn more, plus a few for the runtime (the sampler's ReadDir).
	if limit := int64(clients + maxConn + 10); peak.Load() > limit {
		t.Errorf("descriptors rose by %d with %d clients, want <= %d (%d clients + cap %d + slack)", peak.Load(), clients, limit, clients, maxConn)
	}
	t.Logf("%d/%d connections answered and closed by the server, %d at the idle timeout; peak +%d descriptors", len(held), clients, atIdle, peak.Load())
}

func freePortString(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// startTestServers starts the HTTP servers o asks for over a proxier with
// nothing to serve, closed at the end of the test.
func startTestServers(t *testing.T, o *options) []*http.Server {
	t.Helper()
	m := proxier.NewMetrics()
	table := faults.NewTable(0, 0, faults.NewMetrics(m.Registry))
	p := proxier.New(proxier.Options{Metrics: m, Faults: table})
	servers, _, err := startServers(t.Context(), o, p, healthcheck.NewProxierHealth(clock.RealClock{}, time.Minute), m, table)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			_ = s.Close()
		}
	})
	return servers
}

// TestEveryHTTPServerHasLimits: the health, metrics and fault API servers
// all come from the shared helper with every timeout set.
func TestEveryHTTPServerHasLimits(t *testing.T) {
	o := newOptions()
	o.healthzBindAddress = "127.0.0.1:0"
	o.metricsBindAddress = "127.0.0.1:0"
	o.faultAPIBind = "127.0.0.1:0"
	servers := startTestServers(t, o)
	if len(servers) != 3 {
		t.Fatalf("%d servers, want 3 (health, metrics, fault API)", len(servers))
	}
	for i, s := range servers {
		if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout != o.httpIdleTimeout || s.MaxHeaderBytes <= 0 {
			t.Errorf("server %d: header %v, read %v, write %v, idle %v, header bytes %d; want all set, idle %v",
				i, s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout, s.MaxHeaderBytes, o.httpIdleTimeout)
		}
	}
}

// The fault API's GET /version answers the binary's version, as
// Toxiproxy's answers its own: it answered the program's name.
func TestFaultAPIVersion(t *testing.T) {
	o := newOptions()
	o.healthzBindAddress, o.metricsBindAddress = "", ""
	o.faultAPIBind = "127.0.0.1:" + freePortString(t)
	startTestServers(t, o)
	resp, err := http.Get("http://" + o.faultAPIBind + "/version")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Version string }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if body.Version != buildVersion() {
		t.Errorf("GET /version: %q, want %q", body.Version, buildVersion())
	}
}
