package e2e

import (
	"context"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// Flood sizes and the proxy's caps under test.
const (
	floodIPs       = 200 // pod1 addresses the flood comes from
	floodPortsEach = 100 // UDP source ports per address: 20,000 sources
	floodHalfOpen  = 5000
	floodSpread    = 12 * time.Second // the UDP sources are spread over this
	// The half-open clients connect over this: a burst of 5,000 in 0.6 s
	// overflowed the lab's veth queues, and the calm probe's TCP p99 became
	// the 200 ms retransmission timeout (60 samples, p99 247 ms), which
	// measures the lab's links, not the proxy.
	halfOpenSpread = 4 * time.Second
	floodPerPort   = 2048 // --udp-max-sessions-per-port
	floodTotal     = 4096 // --udp-max-sessions
	quietWindow    = 3 * time.Second
	// synRetransmit is TCP's first SYN retransmission (1 s): a calm p99
	// at or over it means more than 1 % of the calm connects lost their
	// SYN (a listen queue overflowed, the node dropped them), which is
	// starvation, not the machine's noise. Below it the p99 is a figure:
	// on a 2-core machine shared by the load generators, the backends and
	// other suites it is the scheduler's tail, not the proxy's (the
	// bounds of 2x, +5 ms, +2x and +3x the direct path's rise all failed
	// in turn on a busy machine, the last at load 24).
	synRetransmit = time.Second
	// The proxy's own descriptors besides sessions and connections
	// (listeners, epoll, HTTP servers, the calm probe's few in flight).
	fdSlack = 128
)

// TestFlood: 20,000 UDP sources (distinct ip:port, one datagram each, sent
// raw so that nothing reads the replies, as forged ones) and 5,000
// half-open TCP clients (connected, never sending) against one Service while a second Service
// keeps serving request/response traffic (TCP on a new connection, UDP from
// a fresh port per query) from another pod. The calm Service is isolated
// from the flood by counts, not by timing: no calm request fails (each is
// answered within 2 s), the calm ports meet no session cap (no session
// evicted, no datagram dropped) and count no failed client, while the
// flooded port meets its cap; the calm p99 stays below TCP's SYN
// retransmission (1 s: past it, calm connects were lost). The calm p99
// quiet (windows before and after) and under the flood, and the same
// requests straight to a backend (the machine's own slowdown), are
// reported as figures: on a 2-core machine shared with the load
// generators, the backends and other suites a bound on their ratio was
// the scheduler's, and failed at any margin tried. The proxy may use at
// most one core. The proxy's descriptors stay within its caps (one per
// UDP session up to --udp-max-sessions, two per live TCP connection; the
// flooded port at --udp-max-sessions-per-port) and fall back once the
// clients are gone.
func TestFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("flood test: -short")
	}
	requireSuite(t)
	// The proxy holds 2 per half-open client plus at most floodTotal
	// sessions: 14,096 and some listeners.
	needNofile(t, 16384)
	c := netns.NewCluster(t, netns.ClusterOptions{ClientIPsEach: floodIPs})
	c.StartBackends(t, backendBin, backendPort)
	// Every half-open client is held (TestTCPShare tests the TCP share: its
	// default, a quarter of the ceiling, is 4,687 under a limit of 20,000).
	p := newProxy(t, c, "--udp-timeout=2s",
		"--udp-max-sessions-per-port="+strconv.Itoa(floodPerPort), "--udp-max-sessions="+strconv.Itoa(floodTotal),
		"--tcp-max-connections-per-port="+strconv.Itoa(floodHalfOpen))
	flood := svc{name: "flood", clusterIP: "10.96.1.10", endpoints: ips(c, 0, 1)}
	calm := svc{name: "calm", clusterIP: "10.96.1.20", endpoints: ips(c, 2, 3)}
	writeSvc(t, p.dir, flood)
	writeSvc(t, p.dir, calm)
	p.Start(t, startWithin)
	warm := harness.Client{Label: "pod2", NS: c.Pod2, Src: c.Pod2IPs[1]}
	for _, s := range []svc{flood, calm} {
		warm.WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
		warm.WaitServed(t, "udp", s.udp(), time.Now(), startBudget)
	}
	pid := p.Proc.Pid
	baseline := fdCount(t, pid)

	// The calm Service's probe runs the whole time; phase says where its
	// samples go.
	const (
		quietBefore = iota
		halfOpening // the half-open clients connect
		udpFlooding // the UDP sources arrive, the half-open clients held
		quietAfter
	)
	var phases [4]probeSamples
	var phase atomic.Int32
	stopProbe := make(chan struct{})
	probeDone := make(chan error, 1)
	pr := &probe{ns: c.Pod2, src: c.Pod2IPs[0], tcp: calm.tcp(), udp: calm.udp(),
		direct: netip.AddrPortFrom(calm.endpoints[0], backendPort)}
	go func() {
		probeDone <- pr.run(stopProbe, func() *probeSamples { return &phases[phase.Load()] })
	}()
	defer stopOnce(stopProbe)

	time.Sleep(quietWindow)

	// The flood: half-open clients first (held to the end), UDP sources
	// spread over floodSpread, the descriptor count sampled throughout.
	phase.Store(halfOpening)
	floodBegan := time.Now()
	cpuBefore := cpuTime(t, pid)
	stopPeak := make(chan struct{})
	peak := fdPeak(t, pid, 50*time.Millisecond, stopPeak)
	defer stopOnce(stopPeak)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srcs := c.Pod1IPs[:floodIPs]
	conns, err := halfOpen(ctx, c.Pod1, srcs, flood.tcp(), floodHalfOpen, 4, halfOpenSpread)
	closeAll := func() {
		for _, conn := range conns {
			conn.Close()
		}
		conns = nil
	}
	defer closeAll()
	if err != nil {
		t.Fatalf("%d half-open clients connected, then: %v", len(conns), err)
	}
	halfOpenAt := time.Since(floodBegan)
	phase.Store(udpFlooding)
	sent, err := udpFlood(c.Pod1, srcs, floodPortsEach, flood.udp(), floodSpread)
	if err != nil {
		t.Fatalf("UDP flood after %d sources: %v", sent, err)
	}
	floodFDs := fdCount(t, pid)
	atCap := sessionLimits(t, p, flood.portName("dns"))
	floodSessions := p.Metric(t, `kubeproxy_userspace_udp_sessions{service_port="`+flood.portName("dns")+`"}`)
	floodTook := time.Since(floodBegan)
	floodCPU := cpuTime(t, pid) - cpuBefore
	closeAll()
	stopOnce(stopPeak)
	peakFDs := <-peak

	phase.Store(quietAfter)
	time.Sleep(quietWindow)
	stopOnce(stopProbe)
	if err := <-probeDone; err != nil {
		t.Fatalf("calm probe: %v", err)
	}

	// Descriptors fall back once the clients are gone and the sessions idle
	// out (--udp-timeout 2 s; the probe's own sessions too).
	var after int
	deadline := time.Now().Add(10 * time.Second)
	for {
		after = fdCount(t, pid)
		if after <= baseline+4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	cpuShare := floodCPU.Seconds() / floodTook.Seconds()
	figure(t, "flood: %d half-open TCP clients connected in %.1f s, %d UDP sources in %.1f s (%.1f s in all); the proxy used %.0f%% of a core",
		floodHalfOpen, halfOpenAt.Seconds(), sent, floodTook.Seconds()-halfOpenAt.Seconds(), floodTook.Seconds(), 100*cpuShare)
	for _, k := range []struct {
		name string
		of   func(*probeSamples) *latencies
		// direct is the same request straight to a backend.
		direct func(*probeSamples) *latencies
	}{
		{"TCP (new connection per request)", func(s *probeSamples) *latencies { return &s.tcp }, func(s *probeSamples) *latencies { return &s.directTCP }},
		{"UDP (fresh source port per query)", func(s *probeSamples) *latencies { return &s.udp }, func(s *probeSamples) *latencies { return &s.directUDP }},
	} {
		quiet := merged(k.of(&phases[quietBefore]), k.of(&phases[quietAfter]))
		flooded := merged(k.of(&phases[halfOpening]), k.of(&phases[udpFlooding]))
		dQuiet := merged(k.direct(&phases[quietBefore]), k.direct(&phases[quietAfter]))
		dFlooded := merged(k.direct(&phases[halfOpening]), k.direct(&phases[udpFlooding]))
		figure(t, "flood: calm %s: quiet %v; flood %v (while half-open clients connect %v; while UDP sources arrive %v)",
			k.name, quiet, flooded, k.of(&phases[halfOpening]), k.of(&phases[udpFlooding]))
		figure(t, "flood: control, the same straight to a backend: quiet %v; flood %v", dQuiet, dFlooded)

		if f := flooded.quantile(0.99); f >= synRetransmit {
			t.Errorf("calm %s p99 under flood %.2f ms: at or over TCP's SYN retransmission (%v), calm clients were lost, not slowed",
				k.name, millis(f), synRetransmit)
		}
		if fails := quiet.failed + flooded.failed; fails > 0 || len(flooded.d) < 100 {
			t.Errorf("calm %s: %d requests failed, %d samples under the flood", k.name, fails, len(flooded.d))
		}
	}
	figure(t, "flood: proxy descriptors %d before, peak %d, %d at the end of the flood, %d after; flood port sessions %.0f (cap %d), at the caps %.0f (evicted or dropped)",
		baseline, peakFDs, floodFDs, after, floodSessions, floodPerPort, atCap)
	if cpuShare > 1 {
		t.Errorf("the proxy used %.0f%% of a core under the flood, want at most one core", 100*cpuShare)
	}
	// Both Services' UDP sessions count against --udp-max-sessions (the
	// calm probe's fresh ports hold up to a thousand of them).
	if limit := baseline + floodTotal + 2*floodHalfOpen + fdSlack; peakFDs > limit {
		t.Errorf("proxy held %d descriptors under the flood: over baseline %d + %d sessions + 2 x %d connections + %d", peakFDs, baseline, floodTotal, floodHalfOpen, fdSlack)
	}
	if floodSessions > floodPerPort {
		t.Errorf("flooded port holds %.0f UDP sessions, over its cap %d", floodSessions, floodPerPort)
	}
	if atCap == 0 {
		t.Errorf("the flooded port never reached a session cap (nothing evicted or dropped): it did not test the caps")
	}
	// Isolation, by count: the flood took none of the calm Service's
	// sessions (the total cap leaves it room) and failed none of its
	// clients.
	if n := sessionLimits(t, p, calm.portName("dns")); n != 0 {
		t.Errorf("the calm UDP port met a session cap %.0f times under the flood (evicted or dropped), want 0", n)
	}
	for _, port := range []string{calm.portName("dns"), calm.portName("http")} {
		if n := p.Metric(t, `kubeproxy_userspace_connections_failed_total{service_port="`+port+`"}`); n != 0 {
			t.Errorf("calm port %s: %.0f clients found no reachable endpoint under the flood, want 0", port, n)
		}
	}
	if after > baseline+fdSlack {
		t.Errorf("proxy still holds %d descriptors 10 s after the flood (baseline %d)", after, baseline)
	}
}

// sessionLimits is how often servicePort met a UDP session cap (sessions
// evicted and datagrams dropped).
func sessionLimits(t *testing.T, p *proxy, servicePort string) float64 {
	t.Helper()
	var n float64
	for _, action := range []string{"evicted", "dropped"} {
		n += p.Metric(t, `kubeproxy_userspace_udp_session_limit_total{action="`+action+`",service_port="`+servicePort+`"}`)
	}
	return n
}

// stopOnce closes stop unless it is closed already.
func stopOnce(stop chan struct{}) {
	select {
	case <-stop:
	default:
		close(stop)
	}
}

// merged is the samples of a and b together.
func merged(a, b *latencies) *latencies {
	return &latencies{d: append(append([]time.Duration(nil), a.d...), b.d...), failed: a.failed + b.failed}
}
