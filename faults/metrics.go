package faults

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics count what faults did, in Envoy's spirit (faults injected per
// kind, faulted connections live).
type Metrics struct {
	Injected *prometheus.CounterVec
	// ports holds every port's faulted_connections and
	// faults_skipped_max_active_total: two atomics per port, printed at
	// scrape time. As vector children they were created for every service
	// port (about 1 KiB each) whether or not it ever saw a toxic.
	ports *portSeries
	// buffers is the table's bound on what faulted directions hold, which
	// the buffered-bytes gauges read.
	buffers atomic.Pointer[bufferBudget]
}

// NewMetrics registers on reg (nil: unregistered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Injected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "userspace", Name: "faults_injected_total",
			Help: "Toxics applied: per connection (TCP) or per datagram (UDP)",
		}, []string{"service_port", "toxic", "type", "stream"}),
		ports: newPortSeries(),
	}
	if reg != nil {
		reg.MustRegister(m.Injected, m.ports,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: "kubeproxy", Subsystem: "userspace", Name: "faults_buffered_bytes",
				Help: "Bytes the faulted TCP directions of every service port hold in flight (read, not yet written), with each one's read in progress, and the UDP datagrams latency delays and reorder holds",
			}, func() float64 { held, _ := m.buffered(); return float64(held) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: "kubeproxy", Subsystem: "userspace", Name: "faults_max_buffered_bytes",
				Help: "--fault-max-buffered-bytes: the bound of faults_buffered_bytes (0: none); a direction that holds nothing still reads",
			}, func() float64 { _, max := m.buffered(); return float64(max) }))
	}
	return m
}

// buffered is what faulted directions hold and the bound; zero before a
// table uses m.
func (m *Metrics) buffered() (held, max int64) {
	if b := m.buffers.Load(); b != nil {
		return b.held.Load(), b.max
	}
	return 0, 0
}

// hold notes a port labelled label: its series stay until the last port
// of that label is released.
func (m *Metrics) hold(label string) { m.ports.hold(label) }

// release notes that a port labelled label went (RemovePort) or took
// another label (SetLabel); the label's series go with the last port of
// it. An unnamed port whose number changes is a new port of the same
// label, opened before the old one is removed: forgotten at that removal,
// the new port's series were gone while it served its toxics.
func (m *Metrics) release(label string) {
	if m.ports.release(label) {
		m.Injected.DeletePartialMatch(prometheus.Labels{"service_port": label})
	}
}

// portCounters are one port's series.
type portCounters struct {
	faulted liveGauge
	skipped eventCounter
	// delayDropped: UDP datagrams dropped at a full delay line.
	delayDropped eventCounter
}

type liveGauge struct{ n atomic.Int64 }

func (g *liveGauge) Inc() { g.n.Add(1) }
func (g *liveGauge) Dec() { g.n.Add(-1) }

type eventCounter struct{ n atomic.Uint64 }

func (c *eventCounter) Inc() { c.n.Add(1) }

// portSeries is the collector of the ports' counters, keyed by the
// service_port label: a label's series exist from its first use (a port's
// first fault: publishLocked) until the last port of that label goes
// (release), as vector children would, or, for a label released while
// faulted connections of its live on (a Service deleted does not cut
// them), until the last of those ends.
type portSeries struct {
	mu    sync.RWMutex
	ports map[string]*portCounters
	// draining are the ports forgotten while faulted connections of theirs
	// lived: their series stay, so that a sum of faulted_connections is
	// every faulted connection the proxy holds, until sweepLocked finds
	// them idle (at the next release or scrape).
	draining map[string]*portCounters
	// holders counts the ports labelled each label (hold, release).
	holders map[string]int
	faulted *prometheus.Desc
	skipped *prometheus.Desc
	dropped *prometheus.Desc
}

func newPortSeries() *portSeries {
	return &portSeries{
		ports:    map[string]*portCounters{},
		draining: map[string]*portCounters{},
		holders:  map[string]int{},
		faulted: prometheus.NewDesc("kubeproxy_userspace_faulted_connections",
			"Live TCP connections with at least one toxic applied", []string{"service_port"}, nil),
		skipped: prometheus.NewDesc("kubeproxy_userspace_faults_skipped_max_active_total",
			"Connections left unfaulted because --fault-max-active faulted connections were live", []string{"service_port"}, nil),
		dropped: prometheus.NewDesc("kubeproxy_userspace_faults_delay_queue_dropped_total",
			"UDP datagrams dropped because the service port's queue of delayed datagrams (one per direction, 10,000 datagrams or 16 MiB), or a reorder toxic's held ones (as many), was full, or faults held --fault-max-buffered-bytes", []string{"service_port"}, nil),
	}
}

// forLabel returns the counters of label, created at zero on first use.
func (s *portSeries) forLabel(label string) *portCounters {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.ports[label]
	if c == nil {
		c = &portCounters{}
		s.ports[label] = c
	}
	delete(s.draining, label) // the label's port is back: old and new connections count together
	return c
}

func (s *portSeries) hold(label string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holders[label]++
}

// release takes a port off label and reports whether it was the last:
// then label's series go, at once when no faulted connection of it lives,
// else when the last one ends (draining).
func (s *portSeries) release(label string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holders[label]--; s.holders[label] > 0 {
		return false
	}
	delete(s.holders, label)
	if c := s.ports[label]; c != nil {
		s.draining[label] = c
	}
	s.sweepLocked()
	return true
}

// sweepLocked drops the series of draining ports whose faulted connections
// have all ended; s.mu is held. A count that moves after goes into the
// dropped struct, unexported, as it would into a deleted child.
func (s *portSeries) sweepLocked() {
	for label, c := range s.draining {
		if c.faulted.n.Load() == 0 {
			delete(s.ports, label)
			delete(s.draining, label)
		}
	}
}

// lookup returns the counters of label, nil when it has none.
func (s *portSeries) lookup(label string) *portCounters {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ports[label]
}

func (s *portSeries) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.faulted
	ch <- s.skipped
	ch <- s.dropped
}

// Collect copies the port list under the lock and prints outside it, so a
// slow scrape never holds up a sync that adds a port.
func (s *portSeries) Collect(ch chan<- prometheus.Metric) {
	type port struct {
		label string
		c     *portCounters
	}
	s.mu.Lock()
	s.sweepLocked() // the draining ports whose last connection ended since
	s.mu.Unlock()
	s.mu.RLock()
	ports := make([]port, 0, len(s.ports))
	for label, c := range s.ports {
		ports = append(ports, port{label, c})
	}
	s.mu.RUnlock()
	for _, p := range ports {
		ch <- prometheus.MustNewConstMetric(s.faulted, prometheus.GaugeValue, float64(p.c.faulted.n.Load()), p.label)
		ch <- prometheus.MustNewConstMetric(s.skipped, prometheus.CounterValue, float64(p.c.skipped.n.Load()), p.label)
		ch <- prometheus.MustNewConstMetric(s.dropped, prometheus.CounterValue, float64(p.c.delayDropped.n.Load()), p.label)
	}
}
