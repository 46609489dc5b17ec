package faults

import (
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Datagram streams: upstream is client→backend.
const (
	StreamUp   = 0
	StreamDown = 1
)

// datagramPlan applies a UDP port's toxics to each datagram. Each stream
// numbers its datagrams, and every decision is a draw on that number, so
// two runs with the same seed lose the same datagrams.
type datagramPlan struct {
	enabled bool
	streams [2][]*datagramToxic
	seq     [2]*atomic.Uint64
	// delays sends each stream's delayed datagrams (latency): the port's,
	// so a change of toxics neither splits a stream over two lines nor
	// loses its order.
	delays *[2]delayLine
	// delayDropped counts the datagrams a full delay line dropped.
	delayDropped *eventCounter
}

type datagramToxic struct {
	*compiled
	*toxicState
	// injected is the toxic's faults_injected_total series on this
	// stream: a down toxic drops both ways, each drop counted under the
	// stream it was dropped on. It hides compiled's.
	injected prometheus.Counter
}

// streamNames are the streams' names, the stream label's values.
var streamNames = [2]string{StreamUp: Upstream, StreamDown: Downstream}

// toxicState is what a toxic carries from one datagram to the next. A
// toxic left unchanged by a change of the port's toxics keeps it, so that
// the change re-draws nothing the toxic decides: each publish built fresh
// state, so adding an unrelated toxic restarted a Gilbert-Elliott model in
// its good state and forgot the datagrams reorder held (which then waited
// their whole delay, overtaken by nothing).
type toxicState struct {
	// Gilbert-Elliott state (loss with p > 0); guarded by mu because
	// downstream datagrams come from one goroutine per session.
	mu  sync.Mutex
	bad bool
	// reorder: per client (ip:port, a session), the datagram held back
	// until that client's next one has been sent. One slot for the whole
	// port let two clients' datagrams overtake each other, and neither
	// client's own stream was ever reordered (the fault audit).
	held map[netip.AddrPort]*heldDatagram
	// heldBytes is what held holds, counted in budget (the process's
	// --fault-max-buffered-bytes, nil: none) as a delay line's datagrams
	// are. Uncounted, held datagrams had no bound: one per client ip:port
	// for up to the toxic's delay, so 3,000 clients' 60 KB datagrams
	// under a 20 s delay took the proxy from 44 to 131 MB with a bound of
	// 2 MB, and faults_buffered_bytes read 0.
	heldBytes int
	budget    *bufferBudget
}

// unholdLocked forgets client's held datagram h and gives its bytes back;
// s.mu is held.
func (s *toxicState) unholdLocked(client netip.AddrPort, h *heldDatagram) {
	delete(s.held, client)
	h.timer.Stop()
	s.heldBytes -= len(h.b)
	s.budget.give(int64(len(h.b)))
}

// heldDatagram is one client's datagram that reorder keeps back.
type heldDatagram struct {
	seq   uint64
	b     []byte
	send  func([]byte)
	timer *time.Timer
}

// toxicSlot names a toxic in one stream of a plan, to find it again in the
// next plan.
type toxicSlot struct {
	stream int
	name   string
}

// newDatagramPlan builds the plan of snapshot s; the toxics of old (the
// port's plan until now, nil if none) that s keeps unchanged keep their
// state.
func newDatagramPlan(p *Port, s *snapshot, old *datagramPlan) *datagramPlan {
	if s.enabled && !slices.ContainsFunc(s.toxics, (*compiled).actsOnDatagrams) {
		return nil // no toxic, or only noop
	}
	var kept map[toxicSlot]*datagramToxic
	if old != nil {
		kept = make(map[toxicSlot]*datagramToxic)
		for i, ts := range old.streams {
			for _, t := range ts {
				kept[toxicSlot{i, t.Name}] = t
			}
		}
	}
	d := &datagramPlan{enabled: s.enabled, seq: [2]*atomic.Uint64{&p.udpSeq[0], &p.udpSeq[1]}, delays: &p.udpDelays, delayDropped: s.delayDropped}
	add := func(i int, t *compiled) {
		dt := &datagramToxic{compiled: t, injected: t.injected}
		if streamNames[i] != t.Stream {
			// down, on the stream it does not name
			dt.injected = p.table.metrics.Injected.WithLabelValues(p.metricLabel(), t.Name, t.Type, streamNames[i])
		}
		if o := kept[toxicSlot{i, t.Name}]; o != nil && sameDraws(o.compiled, t) {
			dt.toxicState = o.toxicState
		} else {
			dt.toxicState = &toxicState{budget: p.udpDelays[StreamUp].budget}
		}
		d.streams[i] = append(d.streams[i], dt)
	}
	for _, t := range s.toxics {
		if t.actsOnDatagrams() {
			i := StreamDown
			if t.Stream == Upstream {
				i = StreamUp
			}
			if t.kind == kindDown {
				// down drops both ways
				add(StreamUp, t)
				add(StreamDown, t)
				continue
			}
			add(i, t)
		}
	}
	return d
}

// actsOnDatagrams tells a toxic that can act on a UDP port's datagrams.
func (c *compiled) actsOnDatagrams() bool {
	return c.kind == kindDatagram || c.kind == kindBoth || c.kind == kindDown
}

// dropDelayedDatagrams drops the datagrams the port's delay lines and
// the reorder toxics of plans hold that drops reports, given the stream
// each is on (nil: every one).
func (p *Port) dropDelayedDatagrams(drops func(stream int, id datagramID) bool, plans ...*datagramPlan) {
	on := func(stream int) func(datagramID) bool {
		if drops == nil {
			return nil
		}
		return func(id datagramID) bool { return drops(stream, id) }
	}
	for i := range p.udpDelays {
		p.udpDelays[i].drop(on(i))
	}
	for _, d := range plans {
		if d == nil {
			continue
		}
		for i, ts := range d.streams {
			for _, t := range ts {
				t.dropHeld(on(i))
			}
		}
	}
}

// dropHeld drops the datagrams reorder holds that drops reports (nil:
// every one).
func (s *toxicState) dropHeld(drops func(datagramID) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for client, h := range s.held {
		if drops == nil || drops(datagramID{h.seq, client}) {
			s.unholdLocked(client, h)
		}
	}
}

// restart puts the toxics' state where a fresh port's is (a
// Gilbert-Elliott loss in its good state), for POST /reset, which numbers
// datagrams from 0 again. What reorder holds is in flight and stays. nil:
// no plan.
func (d *datagramPlan) restart() {
	if d == nil {
		return
	}
	for _, ts := range d.streams {
		for _, t := range ts {
			t.mu.Lock()
			t.bad = false
			t.mu.Unlock()
		}
	}
}

// sameDraws reports whether a and b decide every datagram alike: the same
// toxic, unchanged.
func sameDraws(a, b *compiled) bool {
	return a.Type == b.Type && a.Stream == b.Stream && a.Toxicity == b.Toxicity &&
		a.seed == b.seed && a.key == b.key &&
		maps.Equal(a.Attributes, b.Attributes) && slices.Equal(a.clients, b.clients)
}

// Datagrams returns the port's UDP fault plan; nil means none applies and
// the datagram goes straight through.
func (p *Port) Datagrams() *DatagramPlan {
	s := p.snap.Load()
	if s.datagram == nil {
		return nil
	}
	return (*DatagramPlan)(s.datagram)
}

// DatagramPlan is the UDP surface the proxier calls.
type DatagramPlan datagramPlan

// Send passes one datagram of stream (StreamUp, StreamDown) from or to
// client (the session's peer) through the toxics; send is called zero or more times, perhaps
// later from another goroutine, with bytes it may keep (b is copied when
// delivery is deferred). send must be safe for concurrent use.
//
// It returns how long from now the datagram's delivery may still be
// deferred (latency, reorder), 0 when it is done: the caller must keep
// what send writes to open that long, or a delay longer than the
// session's idle timeout loses the datagram.
func (dp *DatagramPlan) Send(stream int, client netip.AddrPort, b []byte, send func([]byte)) time.Duration {
	d := (*datagramPlan)(dp)
	seq := d.seq[stream].Add(1) - 1
	if !d.enabled {
		return 0
	}
	var delay, latency time.Duration
	copies := 1
	var reorder *datagramToxic
	shaped := false // by a latency or duplicate toxic
	for _, t := range d.streams[stream] {
		if !t.draws(client.Addr(), seq) {
			continue
		}
		e := draw(t.seed, t.key, seq, saltEffect)
		switch t.Type {
		case "down":
			t.injected.Inc()
			return 0
		case "loss":
			if t.lose(e, seq) {
				t.injected.Inc()
				return 0
			}
		case "latency":
			shaped = true
			d := t.ms("latency")
			if j := t.ms("jitter"); j > 0 {
				d += time.Duration((2*draw(t.seed, t.key, seq, saltStream) - 1) * float64(j))
			}
			// As on TCP: the stages add up, and a stage's jitter never
			// takes the datagram back before the stages it passed.
			latency = addDelay(latency, d)
			delay = max(delay, latency)
		case "duplicate":
			if t.duplicates(e) {
				shaped = true
				copies++
			}
		case "reorder":
			if e < t.Attributes["rate"] {
				reorder = t
			}
		}
	}
	// The latency and duplicate toxics that acted are counted once the
	// datagram passed every toxic and was taken: one that a later loss or
	// down dropped, or that a full delay line or reorder toxic dropped
	// (counted in delay_queue_dropped), was neither delayed nor sent
	// twice. A delayed one is counted as its delay line takes it (its
	// first copy), which may be after reorder let it go.
	countNow := shaped && delay <= 0
	out := send
	if delay > 0 {
		b = append([]byte(nil), b...)
		line := &d.delays[stream]
		id := datagramID{seq, client}
		// One goroutine calls out for all of a datagram's copies (Send's,
		// or whoever releases reorder's hold), in turn.
		counted := !shaped
		out = func(b []byte) {
			// Due from when it leaves reorder (now, unless reorder held
			// it): due from its arrival, a held datagram was sorted back
			// before the one that overtook it, and latency undid every
			// reorder.
			if !line.add(time.Now().Add(delay), id, b, send) {
				d.delayDropped.Inc()
				return
			}
			if !counted {
				counted = true
				d.countShaping(stream, client.Addr(), seq)
			}
		}
	}
	for _, t := range d.streams[stream] {
		if t.Type == "reorder" && t != reorder {
			// Whatever is held for this client goes out after this datagram.
			defer t.release(client)
		}
	}
	if reorder != nil {
		if !reorder.hold(client, seq, b, out, copies) {
			// Past the bound of what may be held, as past a delay
			// line's: UDP has no back-pressure.
			d.delayDropped.Inc()
			return 0
		}
		reorder.injected.Inc()
		if countNow {
			d.countShaping(stream, client.Addr(), seq)
		}
		return max(delay, 0) + reorder.ms("delay")
	}
	if countNow {
		d.countShaping(stream, client.Addr(), seq)
	}
	for range copies {
		out(b)
	}
	return max(delay, 0)
}

// countShaping counts the latency and duplicate toxics of stream that
// acted on datagram seq, which passed: Send's draws again (pure), rather
// than a record of them per datagram.
func (d *datagramPlan) countShaping(stream int, client netip.Addr, seq uint64) {
	for _, t := range d.streams[stream] {
		switch t.Type {
		case "latency":
			if t.draws(client, seq) {
				t.injected.Inc()
			}
		case "duplicate":
			if t.draws(client, seq) && t.duplicates(draw(t.seed, t.key, seq, saltEffect)) {
				t.injected.Inc()
			}
		}
	}
}

// duplicates decides a duplicate toxic's effect draw e.
func (t *datagramToxic) duplicates(e float64) bool { return e < t.Attributes["rate"] }

// lose decides loss for one datagram: a plain rate, or tc-netem's
// Gilbert-Elliott model when p > 0 (bursts of loss).
func (t *datagramToxic) lose(e float64, seq uint64) bool {
	p := t.Attributes["p"]
	if p == 0 {
		return e < t.Attributes["rate"]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tr := draw(t.seed, t.key, seq, saltStream)
	if t.bad {
		if tr < t.Attributes["r"] {
			t.bad = false
		}
	} else if tr < p {
		t.bad = true
	}
	if t.bad {
		return e < t.Attributes["loss_bad"]
	}
	return e < t.Attributes["loss_good"]
}

// hold keeps b back until client's next datagram of the stream has been
// sent or delay ms passed, whichever is first. When one is held already, b
// overtakes it instead (b is sent, then the held one): every datagram the
// rate draws is then reordered. Holding b in turn sent the held one first,
// so rate 1 kept the stream in order (the UDP audit: r0…r7 in order at
// rate 1, swapped pairs at 0.5). It reports false, sending nothing, when
// b would take what the toxic holds past a delay line's bound
// (delayLineMaxDatagrams, delayLineMaxBytes) or what faults hold together
// past --fault-max-buffered-bytes (a toxic holding nothing still holds
// one, as an empty delay line takes one).
func (t *datagramToxic) hold(client netip.AddrPort, seq uint64, b []byte, send func([]byte), copies int) bool {
	t.mu.Lock()
	if prev := t.held[client]; prev != nil {
		t.unholdLocked(client, prev)
		t.mu.Unlock()
		for range copies {
			send(b)
		}
		prev.send(prev.b)
		return true
	}
	if len(t.held) >= delayLineMaxDatagrams || t.heldBytes+len(b) > delayLineMaxBytes ||
		!t.budget.hold(int64(len(b)), len(t.held) == 0) {
		t.mu.Unlock()
		return false
	}
	t.heldBytes += len(b)
	h := &heldDatagram{seq: seq, b: append([]byte(nil), b...), send: func(b []byte) {
		for range copies {
			send(b)
		}
	}}
	if t.held == nil {
		t.held = make(map[netip.AddrPort]*heldDatagram)
	}
	t.held[client] = h
	// Released by its own timer only while it is still the one held.
	h.timer = time.AfterFunc(t.ms("delay"), func() { t.releaseHeld(client, h) })
	t.mu.Unlock()
	return true
}

// release sends client's held datagram, if any.
func (t *datagramToxic) release(client netip.AddrPort) {
	t.mu.Lock()
	h := t.held[client]
	if h != nil {
		t.unholdLocked(client, h)
	}
	t.mu.Unlock()
	if h != nil {
		h.send(h.b)
	}
}

func (t *datagramToxic) releaseHeld(client netip.AddrPort, h *heldDatagram) {
	t.mu.Lock()
	if t.held[client] != h {
		t.mu.Unlock()
		return // sent already
	}
	t.unholdLocked(client, h)
	t.mu.Unlock()
	h.send(h.b)
}
