package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// shareNofile is the proxy's open-file limit in TestTCPShare: a connections'
// ceiling of 960 descriptors (1024 less 64 kept back), of which the default
// per-port share is 240 connections (480 descriptors, two per connection).
const (
	shareNofile  = 1024
	shareFlood   = 600 // idle clients of the flooded Service: 1,200 descriptors, past the ceiling
	sharePerPort = 240
)

// TestTCPShare: idle clients of one Service (connected, never sending, never
// closing, as a flood or a slow_close hold leaves them) cannot take every
// descriptor of the proxy: the Service's proxy socket holds at most its
// share (--tcp-max-connections-per-port, by default a quarter of the
// connections' ceiling), its clients past it are reset at accept and
// counted, the connections it holds go on, and a client of another Service
// is served. Before the share, the flood's connections filled the ceiling
// and the other Service's client was reset ("Clients refused: connections
// hold every descriptor not kept back"). Both data paths.
func TestTCPShare(t *testing.T) {
	if testing.Short() {
		t.Skip("TCP share test: -short")
	}
	requireSuite(t)
	needNofile(t, 4*shareFlood)
	for _, path := range []string{"eventloop", "goroutines"} {
		t.Run(path, func(t *testing.T) { testTCPShare(t, path) })
	}
}

func testTCPShare(t *testing.T, dataPath string) {
	c := netns.NewCluster(t, netns.ClusterOptions{ClientIPsEach: 8})
	c.StartBackends(t, backendBin, backendPort)
	p := newProxy(t, c, "--data-path", dataPath)
	// Under a limit of its own, the flood's clients here stay below the
	// test's (prlimit execs the proxy in place: the pid is the proxy's).
	p.Args = append([]string{"--nofile=" + strconv.Itoa(shareNofile) + ":" + strconv.Itoa(shareNofile), "--", p.Bin}, p.Args...)
	p.Bin = "prlimit"
	flood := svc{name: "flood", clusterIP: "10.96.1.10", endpoints: ips(c, 0, 1)}
	calm := svc{name: "calm", clusterIP: "10.96.1.20", endpoints: ips(c, 2, 3)}
	writeSvc(t, p.dir, flood)
	writeSvc(t, p.dir, calm)
	p.Start(t, startWithin)
	calmClient := harness.Client{Label: "pod2", NS: c.Pod2, Src: c.Pod2IPs[0]}
	for _, s := range []svc{flood, calm} {
		calmClient.WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns, err := idleClients(ctx, c.Pod1, c.Pod1IPs, flood.tcp(), shareFlood)
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	if err != nil {
		t.Fatalf("%d idle clients connected, then: %v", len(conns), err)
	}
	// Every flood client accepted: relayed (active) or refused (failed).
	floodPort := flood.portName("http")
	var active, failed float64
	deadline := time.Now().Add(20 * time.Second)
	for {
		active = p.Metric(t, `kubeproxy_userspace_active_connections{service_port="`+floodPort+`"}`)
		failed = p.Metric(t, `kubeproxy_userspace_connections_failed_total{service_port="`+floodPort+`"}`)
		if active+failed >= shareFlood || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	figure(t, "tcp share (%s): %d idle clients of %s under a limit of %d: %.0f relayed, %.0f refused; proxy descriptors %d",
		dataPath, shareFlood, floodPort, shareNofile, active, failed, fdCount(t, p.Proc.Pid))

	// The other Service's client is served, and its port counts no failure.
	for i := range 5 {
		if _, err := calmClient.Ask("tcp", calm.tcp(), 3*time.Second); err != nil {
			t.Fatalf("request %d to the calm Service while %s's clients are held: %v", i, floodPort, err)
		}
	}
	if n := p.Metric(t, `kubeproxy_userspace_connections_failed_total{service_port="`+calm.portName("http")+`"}`); n != 0 {
		t.Errorf("calm port: %.0f clients refused, want 0", n)
	}
	if active > sharePerPort {
		t.Errorf("flooded port relays %.0f connections, over its share %d", active, sharePerPort)
	}
	if capped := p.Metric(t, `kubeproxy_userspace_tcp_connection_limit_total{limit="per_port",service_port="`+floodPort+`"}`); capped != failed || capped < shareFlood-sharePerPort {
		t.Errorf("flooded port: %.0f clients refused at its share, %.0f failed in all; want every failure (at least %d) at the share", capped, failed, shareFlood-sharePerPort)
	}
	if n := p.Metric(t, `kubeproxy_userspace_tcp_connection_limit_total{limit="descriptors"}`); n != 0 {
		t.Errorf("%.0f clients refused at the descriptor ceiling, want 0: the share keeps the flood below it", n)
	}
	if lines := p.LogLines("--tcp-max-connections-per-port"); !containsAny(lines, floodPort) {
		t.Errorf("no log line names %s at its share: %q", floodPort, lines)
	}
	// The connections the share holds are served: the first client asks.
	if err := ask(conns[0]); err != nil {
		t.Errorf("a held client of the flooded Service: %v", err)
	}
}

// idleClients connects n TCP clients from srcs (in turn) to dst, one after
// another, and never sends on them; the connections that stay open are
// returned. A client reset in its handshake (refused at accept, before its
// connect returned) is no error: it is what a flooded port does.
func idleClients(ctx context.Context, ns *netns.NS, srcs []netip.Addr, dst netip.AddrPort, n int) ([]net.Conn, error) {
	var conns []net.Conn
	err := ns.Do(func() error {
		for i := range n {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: srcs[i%len(srcs)].AsSlice()}, Timeout: 5 * time.Second}
			c, err := d.DialContext(ctx, "tcp", dst.String())
			if errors.Is(err, syscall.ECONNRESET) {
				continue
			}
			if err != nil {
				return fmt.Errorf("idle client %d: %w", i, err)
			}
			conns = append(conns, c)
		}
		return nil
	})
	return conns, err
}

// containsAny tells whether any of lines contains s.
func containsAny(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}
