package faults

import (
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// compiled is a toxic ready for the data path: parsed clients, its seed
// and key, its counter resolved once.
type compiled struct {
	Toxic
	origin   string
	kind     kind
	seed     uint64
	key      uint64
	clients  []netip.Prefix
	injected prometheus.Counter
}

// draws reports whether the toxic applies to the connection or datagram
// with this sequence number from client: its clients match and its
// toxicity draw falls under. Accept, Send and a down toxic's cut of what
// is live all decide with it, so they agree.
func (c *compiled) draws(client netip.Addr, seq uint64) bool {
	return c.matches(client) && draw(c.seed, c.key, seq, saltToxicity) < float64(c.Toxicity)
}

func (c *compiled) matches(client netip.Addr) bool {
	if len(c.clients) == 0 {
		return true
	}
	// An IPv4 client on a dual-stack socket arrives as ::ffff:a.b.c.d, a
	// link-local one with its interface as the zone, which no prefix
	// contains.
	client = client.Unmap().WithZone("")
	for _, p := range c.clients {
		if p.Contains(client) {
			return true
		}
	}
	return false
}

// addDelay is sum + d, held at the longest duration rather than wrapping
// to a negative one: each attribute is bounded (maxAttribute), a chain of
// them is not.
func addDelay(sum, d time.Duration) time.Duration {
	if d > 0 && sum > math.MaxInt64-d {
		return math.MaxInt64
	}
	return sum + d
}

func (c *compiled) ms(attr string) time.Duration {
	return time.Duration(c.Attributes[attr] * float64(time.Millisecond))
}

// snapshot is a port's toxics at one moment; immutable once published.
type snapshot struct {
	enabled bool
	toxics  []*compiled // annotation toxics first, then API ones, in order
	// acting: a toxic other than noop is among toxics. Without one a
	// connection's number decides nothing (InOrder) and Accept has
	// nothing to apply.
	acting bool
	// datagram is the UDP plan, nil when no toxic acts on datagrams.
	datagram *datagramPlan
	// refusals: a down or refuse toxic is among toxics, so Accept looks
	// for a refusal before the cap (refuses); without one it need not.
	refusals bool
	// Per-port series, resolved once per snapshot.
	faultedLive  *liveGauge
	skipped      *eventCounter
	delayDropped *eventCounter
}

// publishLocked builds and stores a new snapshot; p.mu is held.
func (p *Port) publishLocked() *snapshot {
	m := p.table.metrics
	label := p.metricLabel()
	// A port's series exist from its first fault (a toxic, or disabled
	// through the API) until the port goes: at zero before its first
	// connection counts, and kept, with their counts, once its faults are
	// removed. A port that never had one has none: nothing can count
	// there, and at 10,000 Services three zero series per service port
	// were 42,000 of the 164,000 on /metrics.
	var c *portCounters
	if len(p.annotation) > 0 || len(p.api) > 0 || !p.enabled {
		c = m.ports.forLabel(label)
	} else if c = m.ports.lookup(label); c == nil {
		c = &portCounters{} // exported by no one; nothing counts without a fault
	}
	s := &snapshot{enabled: p.enabled, faultedLive: &c.faulted, skipped: &c.skipped, delayDropped: &c.delayDropped}
	add := func(tx Toxic, origin string) {
		seed := p.table.seed
		if tx.Seed != nil {
			seed = *tx.Seed
		}
		c := &compiled{
			Toxic: tx, origin: origin, kind: toxicTypes[tx.Type].kind,
			seed: uint64(seed), key: keyOf(tx.Name, p.name),
			injected: m.Injected.WithLabelValues(label, tx.Name, tx.Type, tx.Stream),
		}
		for _, cl := range tx.Clients {
			if pfx, err := parseClient(cl); err == nil {
				c.clients = append(c.clients, pfx)
			}
		}
		s.toxics = append(s.toxics, c)
		s.refusals = s.refusals || c.refuses()
		s.acting = s.acting || c.kind != kindNoop
	}
	for _, tx := range p.annotation {
		add(tx, OriginAnnotation)
	}
	for _, tx := range p.api {
		add(tx, OriginAPI)
	}
	if p.protocol == "UDP" {
		var old *datagramPlan
		if prev := p.snap.Load(); prev != nil {
			old = prev.datagram
		}
		s.datagram = newDatagramPlan(p, s, old)
		if !s.enabled {
			// Down drops datagrams, also those a toxic still delays: they
			// went out up to the delay later.
			p.dropDelayedDatagrams(nil, old, s.datagram)
		}
	}
	old := p.snap.Swap(s)
	if old != nil {
		p.retireRemoved(m, label, old.toxics, s.toxics)
	}
	return s
}

// retiredSeriesKept is how many removed toxics' faults_injected_total
// series a port keeps.
const retiredSeriesKept = 16

// seriesKey is one faults_injected_total series of a port.
type seriesKey struct{ label, name, typ, stream string }

// retireRemoved keeps the faults_injected_total series of the toxics in
// before that after no longer has (removed through the API or the
// annotation, or changed type or stream), up to retiredSeriesKept per
// port, the oldest deleted first; a toxic that comes back takes its series
// up again. Deleted at once, a toxic an experiment added and removed
// between two scrapes (seconds, where Prometheus scrapes every 15-60 s)
// was never seen counting; kept without a bound, experiments that add and
// remove toxics by the thousand left a series behind for each. p.mu is
// held.
func (p *Port) retireRemoved(m *Metrics, label string, before, after []*compiled) {
	if len(before) == 0 && len(p.retired) == 0 {
		return // nothing removed, nothing kept: most ports, at every change
	}
	// A set, not a search per toxic: a suite that adds toxics by the
	// thousand without removing them made every change quadratic (3.7 ms
	// an add at 2,100 toxics, under the port's lock).
	live := make(map[seriesKey]struct{}, len(after))
	for _, a := range after {
		for _, stream := range p.seriesStreams(a) {
			live[seriesKey{label, a.Name, a.Type, stream}] = struct{}{}
		}
	}
	p.retired = slices.DeleteFunc(p.retired, func(k seriesKey) bool {
		_, back := live[k]
		return back
	})
	for _, b := range before {
		for _, stream := range p.seriesStreams(b) {
			key := seriesKey{label, b.Name, b.Type, stream}
			if _, kept := live[key]; !kept && !slices.Contains(p.retired, key) {
				p.retired = append(p.retired, key)
			}
		}
	}
	if n := len(p.retired) - retiredSeriesKept; n > 0 {
		for _, k := range p.retired[:n] {
			m.Injected.DeleteLabelValues(k.label, k.name, k.typ, k.stream)
		}
		p.retired = slices.Delete(p.retired, 0, n)
	}
}

// seriesStreams are the stream labels of c's faults_injected_total series:
// its stream, and on a UDP port both for a down toxic, which drops both
// ways (newDatagramPlan).
func (p *Port) seriesStreams(c *compiled) []string {
	if p.protocol == "UDP" && c.kind == kindDown {
		return streamNames[:]
	}
	return []string{c.Stream}
}

// metricLabel is the port's service_port label; p.mu is held.
func (p *Port) metricLabel() string {
	if p.label != "" {
		return p.label
	}
	return p.name
}

// SetLabel sets the service_port label of the port's series (the
// proxier's "namespace/service:port"); the API name is the default.
func (p *Port) SetLabel(label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.label != label && p.goneLocked() == nil {
		p.table.metrics.release(p.metricLabel())
		p.label = label
		p.table.metrics.hold(p.metricLabel())
		p.publishLocked()
	}
}
