package proxier

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// portMetrics are one service port's data-path series. Its sockets (the
// cluster-wide one and an external one share them) update them with one
// atomic add; portSeries prints them at scrape time. As prometheus
// vectors they cost 3.6 KiB of heap per TCP port (7 children with their
// label pairs) and 9 µs to create, a tenth of a first sync's socket work at
// 10,000 Services; the counts are what a scrape needs, the rest is ours.
type portMetrics struct {
	label    string
	tcp, udp bool // which sockets asked: its families; under portSeries.mu

	active       gauge // TCP connections being proxied
	failed       counter
	dialFailures counter
	dialRetries  counter
	// TCP clients that reset while their endpoint was being dialled.
	abandoned    counter
	acceptErrors counter
	// TCP connections max age or drain-removed closed: quiet, or busy at
	// the close deadline.
	closedQuiet      counter
	closedAtDeadline counter
	bytesIn          counter
	bytesOut         counter
	udpSessions      gauge
	udpEvicted       counter
	udpDropped       counter
	// TCP clients refused at the socket's share and at the descriptor
	// ceiling (tcp_share.go).
	tcpAtShare   counter
	tcpAtCeiling counter
}

type counter struct{ n atomic.Uint64 }

func (c *counter) Inc() { c.n.Add(1) }

// Add takes a float64, as prometheus counters and relay.Counter do; the
// counts are bytes and events, whole and never negative.
func (c *counter) Add(v float64) { c.n.Add(uint64(v)) }
func (c *counter) value() float64 {
	return float64(c.n.Load())
}

type gauge struct{ n atomic.Int64 }

func (g *gauge) Inc() { g.n.Add(1) }
func (g *gauge) Dec() { g.n.Add(-1) }
func (g *gauge) value() float64 {
	return float64(g.n.Load())
}

// portSeries owns the per-port series: a port's exist from its first
// socket's open until forget, as prometheus vectors' children would, or,
// for a port forgotten while connections of its live on (a Service
// deleted does not cut them), until the last of those ends.
type portSeries struct {
	mu    sync.RWMutex
	ports map[string]*portMetrics
	// draining are the ports of ports forgotten while their TCP
	// connections or UDP sessions lived: so that a sum of
	// active_connections is every connection the proxy holds and their
	// bytes are seen, their series stay until sweepLocked finds them idle
	// (at the next forget or scrape).
	draining map[string]*portMetrics
	// conns are the live TCP connections whose bytes a scrape counts so
	// far (byteCount); the latest proxier built on these Metrics wins.
	conns atomic.Pointer[connRegistry]

	active, failed, dialFailures, dialRetries, abandoned, acceptErrors, lifetimeCloses, bytes, udpSessions, udpLimit, tcpLimit *prometheus.Desc
}

func newPortSeries() *portSeries {
	desc := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("kubeproxy", "userspace", name), help,
			append([]string{"service_port"}, extra...), nil)
	}
	return &portSeries{
		ports:        map[string]*portMetrics{},
		draining:     map[string]*portMetrics{},
		active:       desc("active_connections", "TCP connections being proxied"),
		failed:       desc("connections_failed_total", "Client connections (TCP) or datagrams (UDP) that found no reachable endpoint"),
		dialFailures: desc("dial_failures_total", "Failed attempts to connect to an endpoint (UDP: an endpoint that refused a session's datagrams or could not be reached)"),
		dialRetries:  desc("dial_retries_total", "Dial attempts made on another endpoint after a failure"),
		abandoned:    desc("connections_abandoned_total", "TCP clients that reset while their endpoint was being dialled (or a connect_delay fault held them): the dial abandoned, no endpoint blamed, not counted failed"),
		acceptErrors: desc("accept_errors_total", "Errors from accept(), such as EMFILE, each followed by a back-off"),
		lifetimeCloses: desc("lifetime_closes_total", "TCP connections closed for their max connection age or drain-removed: when quiet = at a quiet moment, deadline = still busy at --connection-close-deadline",
			"when"),
		bytes:       desc("bytes_total", "Bytes proxied; direction in = client to endpoint, out = endpoint to client", "direction"),
		udpSessions: desc("udp_sessions", "UDP client sessions with a backend socket"),
		udpLimit: desc("udp_session_limit_total", "UDP sessions at a session cap: action evicted = the port's oldest idle session closed to make room (for a new client of its own or, at the total cap, of another port), dropped = a new client's datagram dropped (no session idle to give up)",
			"action"),
		tcpLimit: desc("tcp_connection_limit_total", "TCP clients refused at a limit (reset before anything is relayed; also counted in connections_failed_total): per_port = the proxy socket held --tcp-max-connections-per-port connections, descriptors = the connections of all ports held every descriptor below the open-file limit's reserve",
			"limit"),
	}
}

// forPort returns the series of the service port labelled label, created
// at zero on first use; udp says which protocol's families the caller
// updates.
func (s *portSeries) forPort(label string, udp bool) *portMetrics {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.ports[label]
	if m == nil {
		m = &portMetrics{label: label}
		s.ports[label] = m
	}
	if s.draining[label] != nil {
		// The label's port is back (re-created, or its protocol changed)
		// while its old connections live: they count on together, and
		// the families are the new port's (active_connections aside, while
		// old TCP connections are in it).
		delete(s.draining, label)
		m.tcp, m.udp = false, false
	}
	if udp {
		m.udp = true
	} else {
		m.tcp = true
	}
	return m
}

// forget drops a removed service port's series, so /metrics does not grow
// with every Service ever seen: at once when no connection or session of
// it lives, else when the last one ends (draining).
func (s *portSeries) forget(label string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.ports[label]; m != nil {
		s.draining[label] = m
	}
	s.sweepLocked()
}

// sweepLocked drops the series of draining ports whose connections and
// sessions have all ended; s.mu is held. A count that moves after (a
// connection accepted as its socket closed) goes into the dropped struct,
// unexported, as it would into a deleted child.
func (s *portSeries) sweepLocked() {
	for label, m := range s.draining {
		if m.active.n.Load() == 0 && m.udpSessions.n.Load() == 0 {
			delete(s.ports, label)
			delete(s.draining, label)
		}
	}
}

// observe makes r's connections the ones flushed at each scrape.
func (s *portSeries) observe(r *connRegistry) { s.conns.Store(r) }

func (s *portSeries) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.active, s.failed, s.dialFailures, s.dialRetries, s.abandoned, s.acceptErrors, s.lifetimeCloses, s.bytes, s.udpSessions, s.udpLimit, s.tcpLimit} {
		ch <- d
	}
}

func (s *portSeries) Collect(ch chan<- prometheus.Metric) {
	type port struct {
		m        *portMetrics
		tcp, udp bool
	}
	if r := s.conns.Load(); r != nil {
		r.flush() // before the counters are read: they include it
	}
	s.mu.Lock()
	s.sweepLocked() // the draining ports whose last connection ended since
	s.mu.Unlock()
	s.mu.RLock()
	ports := make([]port, 0, len(s.ports))
	for _, m := range s.ports {
		ports = append(ports, port{m, m.tcp, m.udp})
	}
	s.mu.RUnlock()
	emit := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	}
	for _, p := range ports {
		m, l := p.m, p.m.label
		emit(s.failed, prometheus.CounterValue, m.failed.value(), l)
		emit(s.dialFailures, prometheus.CounterValue, m.dialFailures.value(), l)
		emit(s.bytes, prometheus.CounterValue, m.bytesIn.value(), l, "in")
		emit(s.bytes, prometheus.CounterValue, m.bytesOut.value(), l, "out")
		if active := m.active.value(); p.tcp || active != 0 {
			emit(s.active, prometheus.GaugeValue, active, l)
		}
		if p.tcp {
			emit(s.dialRetries, prometheus.CounterValue, m.dialRetries.value(), l)
			emit(s.abandoned, prometheus.CounterValue, m.abandoned.value(), l)
			emit(s.acceptErrors, prometheus.CounterValue, m.acceptErrors.value(), l)
			emit(s.lifetimeCloses, prometheus.CounterValue, m.closedQuiet.value(), l, "quiet")
			emit(s.lifetimeCloses, prometheus.CounterValue, m.closedAtDeadline.value(), l, "deadline")
			emit(s.tcpLimit, prometheus.CounterValue, m.tcpAtShare.value(), l, "per_port")
			emit(s.tcpLimit, prometheus.CounterValue, m.tcpAtCeiling.value(), l, "descriptors")
		}
		if p.udp {
			emit(s.udpSessions, prometheus.GaugeValue, m.udpSessions.value(), l)
			emit(s.udpLimit, prometheus.CounterValue, m.udpEvicted.value(), l, "evicted")
			emit(s.udpLimit, prometheus.CounterValue, m.udpDropped.value(), l, "dropped")
		}
	}
}
