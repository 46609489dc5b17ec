package faults

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
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
	// delays sends each stream's delayed datagrams (latency).
	delays [2]delayLine
}

type datagramToxic struct {
	*compiled
	// Gilbert-Elliott state (loss with p > 0); guarded by mu because
	// downstream datagrams come from one goroutine per session.
	mu  sync.Mutex
	bad bool
	// reorder: the datagram held back, sent after the next one.
	held     []byte
	heldSend func([]byte)
	heldT    *time.Timer
}

func newDatagramPlan(p *Port, s *snapshot) *datagramPlan {
	if s.enabled && len(s.toxics) == 0 {
		return nil
	}
	d := &datagramPlan{enabled: s.enabled, seq: [2]*atomic.Uint64{&p.udpSeq[0], &p.udpSeq[1]}}
	for _, t := range s.toxics {
		if t.kind == kindDatagram || t.kind == kindBoth || t.kind == kindDown {
			i := StreamDown
			if t.Stream == Upstream {
				i = StreamUp
			}
			if t.kind == kindDown {
				// down drops both ways
				d.streams[StreamUp] = append(d.streams[StreamUp], &datagramToxic{compiled: t})
				d.streams[StreamDown] = append(d.streams[StreamDown], &datagramToxic{compiled: t})
				continue
			}
			d.streams[i] = append(d.streams[i], &datagramToxic{compiled: t})
		}
	}
	return d
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
// client through the toxics; send is called zero or more times, perhaps
// later from another goroutine, with bytes it may keep (b is copied when
// delivery is deferred). send must be safe for concurrent use.
//
// It returns how long from now the datagram's delivery may still be
// deferred (latency, reorder), 0 when it is done: the caller must keep
// what send writes to open that long, or a delay longer than the
// session's idle timeout loses the datagram.
func (dp *DatagramPlan) Send(stream int, client netip.Addr, b []byte, send func([]byte)) time.Duration {
	d := (*datagramPlan)(dp)
	seq := d.seq[stream].Add(1) - 1
	if !d.enabled {
		return 0
	}
	var delay, latency time.Duration
	copies := 1
	var reorder *datagramToxic
	for _, t := range d.streams[stream] {
		if !t.matches(client) || draw(t.seed, t.key, seq, saltToxicity) >= float64(t.Toxicity) {
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
			t.injected.Inc()
			d := t.ms("latency")
			if j := t.ms("jitter"); j > 0 {
				d += time.Duration((2*draw(t.seed, t.key, seq, saltStream) - 1) * float64(j))
			}
			// As on TCP: the stages add up, and a stage's jitter never
			// takes the datagram back before the stages it passed.
			latency = addDelay(latency, d)
			delay = max(delay, latency)
		case "duplicate":
			if e < t.Attributes["rate"] {
				t.injected.Inc()
				copies++
			}
		case "reorder":
			if e < t.Attributes["rate"] {
				reorder = t
			}
		}
	}
	out := send
	if delay > 0 {
		b = append([]byte(nil), b...)
		due := time.Now().Add(delay)
		line := &d.delays[stream]
		out = func(b []byte) { _ = line.add(due, b, send) }
	}
	for _, t := range d.streams[stream] {
		if t.Type == "reorder" && t != reorder {
			// Whatever is held goes out after this datagram.
			defer t.release()
		}
	}
	if reorder != nil {
		reorder.injected.Inc()
		reorder.hold(b, out, copies)
		return max(delay, 0) + reorder.ms("delay")
	}
	for range copies {
		out(b)
	}
	return max(delay, 0)
}

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

// hold keeps b back until the next datagram of the stream has been sent
// or delay ms passed, whichever is first. When one is held already, b
// overtakes it instead (b is sent, then the held one): every datagram the
// rate draws is then reordered. Holding b in turn sent the held one first,
// so rate 1 kept the stream in order (the UDP audit: r0…r7 in order at
// rate 1, swapped pairs at 0.5).
func (t *datagramToxic) hold(b []byte, send func([]byte), copies int) {
	t.mu.Lock()
	if prev, prevSend := t.held, t.heldSend; prev != nil {
		t.held, t.heldSend = nil, nil
		if t.heldT != nil {
			t.heldT.Stop()
			t.heldT = nil
		}
		t.mu.Unlock()
		for range copies {
			send(b)
		}
		prevSend(prev)
		return
	}
	t.held = append([]byte(nil), b...)
	t.heldSend = func(b []byte) {
		for range copies {
			send(b)
		}
	}
	t.heldT = time.AfterFunc(t.ms("delay"), t.release)
	t.mu.Unlock()
}

func (t *datagramToxic) release() {
	t.mu.Lock()
	b, send := t.held, t.heldSend
	t.held, t.heldSend = nil, nil
	if t.heldT != nil {
		t.heldT.Stop()
		t.heldT = nil
	}
	t.mu.Unlock()
	if b != nil {
		send(b)
	}
}
