package proxier

import (
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
)

// portSeriesNames are the per-service-port data-path families.
var portSeriesNames = []string{
	"kubeproxy_userspace_active_connections",
	"kubeproxy_userspace_connections_failed_total",
	"kubeproxy_userspace_connections_abandoned_total",
	"kubeproxy_userspace_dial_failures_total",
	"kubeproxy_userspace_dial_retries_total",
	"kubeproxy_userspace_accept_errors_total",
	"kubeproxy_userspace_lifetime_closes_total",
	"kubeproxy_userspace_bytes_total",
	"kubeproxy_userspace_udp_sessions",
	"kubeproxy_userspace_udp_session_limit_total",
	"kubeproxy_userspace_tcp_connection_limit_total",
}

// A service port's series exist, at zero, from the moment its socket
// opens (a TCP port has no UDP series, a UDP port no TCP-only ones), count
// what its traffic does, and go when the Service goes: what dashboards and
// the e2e suites read off /metrics.
func TestPortSeriesExposition(t *testing.T) {
	backend := serveTCP(t, "127.0.0.1", func(c net.Conn) {
		io.Copy(c, c)
		c.Close()
	})
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend.Addr().String()))
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP), withClusterIP("10.96.0.53")))
	p.Sync()

	c, err := net.DialTimeout("tcp", proxyAddr(t, p, "default/web:p"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	c.Close()
	u, err := net.Dial("udp", proxyAddr(t, p, "default/dns:p")) // no endpoints: dropped
	if err != nil {
		t.Fatal(err)
	}
	u.Write([]byte("q"))
	u.Close()

	want := `
# HELP kubeproxy_userspace_accept_errors_total Errors from accept(), such as EMFILE, each followed by a back-off
# TYPE kubeproxy_userspace_accept_errors_total counter
kubeproxy_userspace_accept_errors_total{service_port="default/web:p"} 0
# HELP kubeproxy_userspace_active_connections TCP connections being proxied
# TYPE kubeproxy_userspace_active_connections gauge
kubeproxy_userspace_active_connections{service_port="default/web:p"} 0
# HELP kubeproxy_userspace_bytes_total Bytes proxied; direction in = client to endpoint, out = endpoint to client
# TYPE kubeproxy_userspace_bytes_total counter
kubeproxy_userspace_bytes_total{direction="in",service_port="default/dns:p"} 0
kubeproxy_userspace_bytes_total{direction="in",service_port="default/web:p"} 5
kubeproxy_userspace_bytes_total{direction="out",service_port="default/dns:p"} 0
kubeproxy_userspace_bytes_total{direction="out",service_port="default/web:p"} 5
# HELP kubeproxy_userspace_connections_abandoned_total TCP clients that reset while their endpoint was being dialled (or a connect_delay fault held them): the dial abandoned, no endpoint blamed, not counted failed
# TYPE kubeproxy_userspace_connections_abandoned_total counter
kubeproxy_userspace_connections_abandoned_total{service_port="default/web:p"} 0
# HELP kubeproxy_userspace_connections_failed_total Client connections (TCP) or datagrams (UDP) that found no reachable endpoint
# TYPE kubeproxy_userspace_connections_failed_total counter
kubeproxy_userspace_connections_failed_total{service_port="default/dns:p"} 1
kubeproxy_userspace_connections_failed_total{service_port="default/web:p"} 0
# HELP kubeproxy_userspace_dial_failures_total Failed attempts to connect to an endpoint (UDP: an endpoint that refused a session's datagrams or could not be reached)
# TYPE kubeproxy_userspace_dial_failures_total counter
kubeproxy_userspace_dial_failures_total{service_port="default/dns:p"} 0
kubeproxy_userspace_dial_failures_total{service_port="default/web:p"} 0
# HELP kubeproxy_userspace_dial_retries_total Dial attempts made on another endpoint after a failure
# TYPE kubeproxy_userspace_dial_retries_total counter
kubeproxy_userspace_dial_retries_total{service_port="default/web:p"} 0
# HELP kubeproxy_userspace_lifetime_closes_total TCP connections closed for their max connection age or drain-removed: when quiet = at a quiet moment, deadline = still busy at --connection-close-deadline
# TYPE kubeproxy_userspace_lifetime_closes_total counter
kubeproxy_userspace_lifetime_closes_total{service_port="default/web:p",when="deadline"} 0
kubeproxy_userspace_lifetime_closes_total{service_port="default/web:p",when="quiet"} 0
# HELP kubeproxy_userspace_tcp_connection_limit_total TCP clients refused at a limit (reset before anything is relayed; also counted in connections_failed_total): per_port = the proxy socket held --tcp-max-connections-per-port connections, descriptors = the connections of all ports held every descriptor below the open-file limit's reserve
# TYPE kubeproxy_userspace_tcp_connection_limit_total counter
kubeproxy_userspace_tcp_connection_limit_total{limit="descriptors",service_port="default/web:p"} 0
kubeproxy_userspace_tcp_connection_limit_total{limit="per_port",service_port="default/web:p"} 0
# HELP kubeproxy_userspace_udp_session_limit_total UDP sessions at a session cap: action evicted = the port's oldest idle session closed to make room (for a new client of its own or, at the total cap, of another port), dropped = a new client's datagram dropped (no session idle to give up)
# TYPE kubeproxy_userspace_udp_session_limit_total counter
kubeproxy_userspace_udp_session_limit_total{action="dropped",service_port="default/dns:p"} 0
kubeproxy_userspace_udp_session_limit_total{action="evicted",service_port="default/dns:p"} 0
# HELP kubeproxy_userspace_udp_sessions UDP client sessions with a backend socket
# TYPE kubeproxy_userspace_udp_sessions gauge
kubeproxy_userspace_udp_sessions{service_port="default/dns:p"} 0
`
	// The connection's end settles its bytes (a scrape before it may
	// still miss the last ones); the dropped datagram is counted when the
	// socket reads it.
	var last error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if last = testutil.GatherAndCompare(p.metrics.Registry, strings.NewReader(want), portSeriesNames...); last == nil {
			break
		}
	}
	if last != nil {
		t.Fatal(last)
	}

	p.OnServiceDelete(makeService("web"))
	p.Sync()
	if n, err := testutil.GatherAndCount(p.metrics.Registry, portSeriesNames...); err != nil || n != 7 {
		t.Errorf("after the TCP Service went: %d per-port series (err %v), want the UDP port's 7", n, err)
	}
}

// A Service deleted while a connection of its lives on (kube-proxy does
// not cut it) keeps its port's series until that connection ends, so that a
// sum of active_connections is every connection the proxy holds; then they
// go, as at once for a port with none.
func TestPortSeriesStayWhileADeletedServicesConnectionLives(t *testing.T) {
	backend := serveTCP(t, "127.0.0.1", func(c net.Conn) {
		io.Copy(c, c)
		c.Close()
	})
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend.Addr().String()))
	p.Sync()
	c, err := net.DialTimeout("tcp", proxyAddr(t, p, "default/web:p"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func() {
		t.Helper()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 5)
		if _, err := c.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	echo()

	p.OnServiceDelete(makeService("web"))
	p.Sync()
	echo() // still proxied
	want := `
# HELP kubeproxy_userspace_active_connections TCP connections being proxied
# TYPE kubeproxy_userspace_active_connections gauge
kubeproxy_userspace_active_connections{service_port="default/web:p"} 1
`
	if err := testutil.GatherAndCompare(p.metrics.Registry, strings.NewReader(want), "kubeproxy_userspace_active_connections"); err != nil {
		t.Errorf("the deleted Service's live connection: %v", err)
	}

	c.Close()
	var n int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n, err = testutil.GatherAndCount(p.metrics.Registry, portSeriesNames...); err == nil && n == 0 {
			return
		}
	}
	t.Errorf("after its last connection ended: %d per-port series of the deleted Service (err %v), want none", n, err)
}

// A port whose protocol changes (TCP to UDP, the same name: the same
// service_port label) while a TCP connection of the old one lives shows
// the UDP port's families, plus active_connections until that connection
// ends.
func TestPortSeriesOfAFlippedPortWhileItsOldConnectionLives(t *testing.T) {
	backend := serveTCP(t, "127.0.0.1", func(c net.Conn) {
		io.Copy(c, c)
		c.Close()
	})
	p := newTestProxier(t, Options{})
	tcpSvc, udpSvc := makeService("web"), makeService("web", withProtocol(v1.ProtocolUDP))
	p.OnServiceAdd(tcpSvc)
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend.Addr().String()))
	p.Sync()
	c, err := net.DialTimeout("tcp", proxyAddr(t, p, "default/web:p"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 5)
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}

	p.OnServiceUpdate(tcpSvc, udpSvc)
	p.Sync()
	families := func() map[string]bool {
		t.Helper()
		got := map[string]bool{}
		mfs, err := p.metrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if slices.Contains(portSeriesNames, mf.GetName()) && len(mf.GetMetric()) > 0 {
				got[strings.TrimPrefix(mf.GetName(), "kubeproxy_userspace_")] = true
			}
		}
		return got
	}
	if f := families(); !f["active_connections"] || !f["udp_sessions"] || f["dial_retries_total"] {
		t.Errorf("flipped to UDP with a TCP connection live: families %v, want active_connections and the UDP ones, no dial_retries_total", f)
	}
	c.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		f := families()
		if !f["active_connections"] && f["udp_sessions"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the old connection ended: families %v, want the UDP port's only", f)
		}
	}
}

// README's cost of the per-port families ("about N series per TCP service
// port and M per UDP one") is what a port exports: it said 11 for TCP
// after connections_abandoned_total made it 12.
func TestREADMEPerPortSeriesCount(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`about (\d+) series per TCP service port and (\d+) per UDP one`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md no longer says how many series a TCP and a UDP service port export; update this test")
	}
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("web"))
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP), withClusterIP("10.96.0.53")))
	p.Sync()
	mfs, err := p.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, mf := range mfs {
		for _, metric := range mf.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetName() == "service_port" {
					series[l.GetValue()]++
				}
			}
		}
	}
	for _, c := range []struct{ proto, port, said string }{{"TCP", "default/web:p", string(m[1])}, {"UDP", "default/dns:p", string(m[2])}} {
		if got := strconv.Itoa(series[c.port]); got != c.said {
			t.Errorf("README.md says a %s service port exports about %s series; %s exports %s", c.proto, c.said, c.port, got)
		}
	}
}
