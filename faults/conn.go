package faults

import (
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// Conn is what faults decided for one TCP connection at accept. Nothing is
// re-drawn later: a toxic added or changed afterwards applies to new
// connections only (re-wiring live ones is Toxiproxy's main source of
// hangs: its #159, #412, #558).
type Conn struct {
	port   *Port
	seq    uint64
	client netip.Addr
	// Refuse: reset the client at once, dial nothing (refuse, down).
	Refuse bool
	// ConnectDelay is waited before the first dial.
	ConnectDelay time.Duration
	// Upstream and Downstream are the faulted copiers; nil = relay's splice.
	Upstream, Downstream relay.Copier
	// up and down are their pipelines (nil: none), which Abort stops.
	up, down *pipeline

	faulted bool
	// applied names the toxics drawn, for Applied.
	applied []string
	snap    *snapshot
	live    *liveConn
}

// liveConn lets a port cut a live connection (down, enabled=false): cut
// resets both of its sockets.
type liveConn struct {
	seq        uint64
	clientAddr netip.Addr
	reset      func()
	conn       *Conn // its pipelines, for a removed timeout or bandwidth 0 toxic
	// wasCut: a down (or the port's) cut it already, so one that races
	// it (Attach, a second down) neither counts it again nor resets twice.
	wasCut atomic.Bool
}

// NextConn numbers the port's next TCP connection, for AcceptNumbered.
// Call it where connections are taken from the listening socket, one at a
// time, so the numbers follow the kernel's accept order (the same seed
// and arrival order give the same faults): in a goroutine per connection
// the scheduler would number them.
func (p *Port) NextConn() uint64 { return p.connSeq.Add(1) - 1 }

// InOrder reports whether the numbers of the port's connections decide
// anything, so that connections accepted side by side (the event loops)
// must be numbered in their accept order: the port has toxics (noop, which
// draws nothing, aside), or live connections are tracked, which a down
// toxic added later cuts by number. A port without either numbers its
// connections in any order at no cost: a down the annotation declares
// later cuts them by those numbers too (Down), so a partial toxicity
// takes its share of them, but of two connections accepted at the same
// moment on two loops either may hold the lower number.
func (p *Port) InOrder() bool {
	return p.table.TrackLive || p.snap.Load().acting
}

// Accept numbers the next connection from client and decides its faults
// (AcceptNumbered): for a caller that accepts one connection at a time.
func (p *Port) Accept(client netip.Addr) *Conn {
	return p.AcceptNumbered(client, p.NextConn())
}

// AcceptNumbered decides the faults of connection seq (NextConn) from
// client. It returns nil when nothing applies and live connections need
// not be tracked: the connection then costs one load and its draws, and
// allocates nothing.
func (p *Port) AcceptNumbered(client netip.Addr, seq uint64) *Conn {
	s := p.snap.Load()
	track := p.table.TrackLive
	if s.enabled && !s.acting && !track {
		return nil
	}
	if !s.enabled {
		return &Conn{port: p, seq: seq, client: client, snap: s, Refuse: true}
	}
	// Decided in locals: the Conn is allocated only for a connection that
	// is faulted or tracked.
	var (
		up, down     []*compiled
		applied      []string
		faulted      bool
		connectDelay time.Duration
	)
	// A refusal (down, refuse) applies whatever --fault-max-active says:
	// the connection ends at accept and holds no slot, and let through
	// unfaulted at the cap it kept a down port up.
	refuse := s.refusals && s.refuses(seq, client)
	for _, t := range s.toxics {
		if t.kind == kindDatagram || t.kind == kindNoop || (refuse && !t.refuses()) || !t.draws(client, seq) {
			// A refused connection ends at accept: only what refuses
			// it acts (and counts in faults_injected_total). A noop
			// acts on nothing, so the connection stays fault-free.
			continue
		}
		// The slot is taken at the first toxic that applies, so two
		// connections accepted at once cannot both take the last one.
		if !faulted && !refuse && !p.reserve() {
			s.skipped.Inc()
			break
		}
		t.injected.Inc()
		faulted = true
		applied = append(applied, t.Name)
		switch t.kind {
		case kindDown:
			refuse = true
		case kindConnect:
			switch t.Type {
			case "refuse":
				refuse = true
			case "connect_delay":
				d := t.ms("delay")
				if j := t.ms("jitter"); j > 0 {
					d += time.Duration((2*draw(t.seed, t.key, seq, saltEffect) - 1) * float64(j))
				}
				connectDelay = addDelay(connectDelay, max(d, 0))
			}
		default:
			if t.Stream == Upstream {
				up = append(up, t)
			} else {
				down = append(down, t)
			}
		}
	}
	if !faulted && !track {
		return nil
	}
	c := &Conn{port: p, seq: seq, client: client, snap: s, faulted: faulted, applied: applied, Refuse: refuse}
	if refuse {
		return c
	}
	c.ConnectDelay = connectDelay
	if len(up) > 0 {
		c.up = newPipeline(up, seq)
		c.up.budget = &p.table.buffers
		c.Upstream = c.up.copy
	}
	if len(down) > 0 {
		c.down = newPipeline(down, seq)
		c.down.budget = &p.table.buffers
		c.Downstream = c.down.copy
	}
	if c.up != nil && c.down != nil {
		c.up.other, c.down.other = c.down, c.up
	}
	if faulted {
		s.faultedLive.Inc()
	}
	return c
}

// reserve takes one of the port's faulted-connection slots, false when
// --fault-max-active are taken.
func (p *Port) reserve() bool {
	limit := int64(p.table.maxActive)
	for {
		n := p.active.Load()
		if limit > 0 && n >= limit {
			return false
		}
		if p.active.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Attach registers the connection's sockets so a port going down can cut
// it; call Done when the relay returned.
func (c *Conn) Attach(client, backend *net.TCPConn) {
	c.AttachReset(func() {
		_ = client.SetLinger(0)
		_ = backend.SetLinger(0)
		client.Close()
		backend.Close()
	})
}

// Faulted reports whether a toxic applies to the connection; false: it is
// only tracked (Table.TrackLive), so a port going down can cut it.
func (c *Conn) Faulted() bool { return c.faulted }

// AttachReset is Attach for a connection relayed elsewhere (the event
// loops): reset resets both of its sockets, from any goroutine; it may be
// called more than once.
func (c *Conn) AttachReset(reset func()) {
	// Every connection with a Conn is tracked, a faulted one without the
	// fault API too: a down toxic the annotation declares later must cut
	// it, and the annotation's removal of a timeout toxic must reach it.
	// (A connection that drew no fault has no Conn without the fault API:
	// the proxier cuts it for a declared down, see Down.)
	c.live = &liveConn{seq: c.seq, clientAddr: c.client, reset: reset, conn: c}
	c.port.liveMu.Lock()
	c.port.live[c.live] = struct{}{}
	c.port.liveMu.Unlock()
	s := c.port.snap.Load()
	// A port set down, or given a down toxic, between accept and now
	// must not keep it: the cut of live connections did not see it yet.
	if !s.enabled {
		c.live.cut()
		return
	}
	if s != c.snap {
		if t := s.downDrawing(c.seq, c.client); t != nil {
			if c.live.cut() {
				t.injected.Inc()
			}
			return
		}
	}
	// Nor a timeout or bandwidth 0 toxic removed since, or with its
	// port: its removal did not see it yet.
	if c.port.removed.Load() && c.held() {
		for _, k := range c.snap.holds() {
			c.up.holdRemoved(k)
			c.down.holdRemoved(k)
		}
		return
	}
	if s != c.snap && c.held() {
		for _, k := range removedHolds(c.snap.holds(), s.holds()) {
			c.up.holdRemoved(k)
			c.down.holdRemoved(k)
		}
	}
}

// held tells whether a toxic that holds it until removed (a timeout, a
// bandwidth 0) applies to the connection.
func (c *Conn) held() bool {
	return c.up.holdsUntilRemoved() || c.down.holdsUntilRemoved()
}

// holds are the keys of s's toxics that hold connections until removed
// (holdsUntilRemoved).
func (s *snapshot) holds() []holdKey {
	var keys []holdKey
	for _, t := range s.toxics {
		if holdsUntilRemoved(t.Type) {
			keys = append(keys, holdKey{t.Name, t.origin, t.Stream})
		}
	}
	return keys
}

// refuses reports whether a down or refuse toxic of s applies to the
// connection with this sequence number.
func (s *snapshot) refuses(seq uint64, client netip.Addr) bool {
	for _, t := range s.toxics {
		if t.refuses() && t.draws(client, seq) {
			return true
		}
	}
	return false
}

// refuses tells a toxic that refuses the connections it draws (down,
// refuse).
func (c *compiled) refuses() bool { return c.kind == kindDown || c.Type == "refuse" }

// downDraws reports whether a down toxic of s applies to the connection
// with this sequence number: the draw Accept would have made.
func (s *snapshot) downDraws(seq uint64, client netip.Addr) bool {
	return s.downDrawing(seq, client) != nil
}

// downDrawing is the first down toxic of s that applies to the connection
// with this sequence number, or nil.
func (s *snapshot) downDrawing(seq uint64, client netip.Addr) *compiled {
	for _, t := range s.toxics {
		if t.kind == kindDown && t.draws(client, seq) {
			return t
		}
	}
	return nil
}

// Down is a down toxic newly in force on a TCP port whose live
// connections the port does not all track: without the fault API
// (Table.TrackLive) a connection that drew no fault has no Conn, so that it
// costs nothing, and the proxier, whose registry holds every live
// connection, cuts those the toxic draws (Port.SetDeclared returns them).
type Down struct {
	port *Port
	t    *compiled
}

// Draws reports whether the down takes the connection numbered seq
// (NextConn) on port from client: the draw Accept makes.
func (d Down) Draws(port *Port, seq uint64, client netip.Addr) bool {
	return port == d.port && d.t.draws(client, seq)
}

// Cut counts one live connection the down cut, in faults_injected_total,
// as one it refuses at accept counts.
func (d Down) Cut() { d.t.injected.Inc() }

// DownDrawing is the down toxic in force that draws connection seq from
// client, if any. A connection that drew no fault at accept (nil from
// AcceptNumbered) asks once it is where Down's cut reaches it (the
// proxier's registry): a down that draws it now came after its accept,
// and its cut may have run before. One load when the port has no down.
func (p *Port) DownDrawing(seq uint64, client netip.Addr) (Down, bool) {
	s := p.snap.Load()
	if !s.refusals {
		return Down{}, false
	}
	if t := s.downDrawing(seq, client); t != nil {
		return Down{p, t}, true
	}
	return Down{}, false
}

// Done releases what Accept and Attach took.
func (c *Conn) Done() {
	if c.live != nil {
		c.port.liveMu.Lock()
		delete(c.port.live, c.live)
		c.port.liveMu.Unlock()
	}
	if c.faulted && !c.Refuse {
		c.port.active.Add(-1)
		c.snap.faultedLive.Dec()
	}
}

// cut resets the connection; false: it was cut already.
func (l *liveConn) cut() bool {
	if l.wasCut.Swap(true) {
		return false
	}
	l.reset()
	return true
}

// cutLive resets the live connections for which which is true, and returns
// how many it cut (not those cut already).
func (p *Port) cutLive(which func(*liveConn) bool) int {
	p.liveMu.Lock()
	var cut []*liveConn
	for l := range p.live {
		if which(l) {
			cut = append(cut, l)
		}
	}
	p.liveMu.Unlock()
	n := 0
	for _, l := range cut {
		if l.cut() {
			n++
		}
	}
	return n
}

// releaseRemovedHolds releases the streams of live connections that the
// removed toxics (removed through the API or /reset, or gone from the
// annotation) hold, as Toxiproxy's removal does: a timeout's end, a
// bandwidth 0's flow on (holdRemoved).
func (p *Port) releaseRemovedHolds(removed []holdKey) {
	if len(removed) == 0 {
		return
	}
	p.liveMu.Lock()
	conns := make([]*Conn, 0, len(p.live))
	for l := range p.live {
		conns = append(conns, l.conn)
	}
	p.liveMu.Unlock()
	for _, c := range conns {
		for _, k := range removed {
			c.up.holdRemoved(k)
			c.down.holdRemoved(k)
		}
	}
}

// cutDown applies a newly added down toxic to live connections (UDP: to
// the datagrams still delayed): the same draw a new connection (datagram)
// with that sequence number would have made. It returns the toxic as s
// compiled it (nil: s has none of that name).
func (p *Port) cutDown(s *snapshot, tx Toxic) *compiled {
	var t *compiled
	for _, c := range s.toxics {
		if c.Name == tx.Name {
			t = c
		}
	}
	if t == nil {
		return nil
	}
	// Each connection it cuts counts, as one it refuses at accept does.
	t.injected.Add(float64(p.cutLive(func(l *liveConn) bool {
		return t.draws(l.clientAddr, l.seq)
	})))
	if s.datagram != nil {
		// UDP: the delayed datagrams it draws, as Send draws a new one,
		// each counted under the stream it was dropped on, as Send
		// counts its drops (they went uncounted).
		var injected [2]prometheus.Counter
		for i, ts := range s.datagram.streams {
			for _, dt := range ts {
				if dt.compiled == t {
					injected[i] = dt.injected
				}
			}
		}
		p.dropDelayedDatagrams(func(stream int, d datagramID) bool {
			if !t.draws(d.client.Addr(), d.seq) {
				return false
			}
			if c := injected[stream]; c != nil {
				c.Inc()
			}
			return true
		}, s.datagram)
	}
	return t
}

// SetBounds gives the faulted directions the relay's bounds, which cannot
// see inside a Copier: halfClose bounds a bandwidth 0 hold once its
// stream's source ended (no direction returned, so the relay's own
// half-close bound never starts), write a write that makes no progress
// (--tcp-write-timeout, as the built-in copies have it); 0: no bound.
func (c *Conn) SetBounds(halfClose, write time.Duration) {
	for _, p := range []*pipeline{c.up, c.down} {
		if p != nil {
			p.holdBound, p.writeTimeout = halfClose, write
		}
	}
}

// Passed is what the toxics of each direction let through so far, up
// (client→backend) and down; -1 for a direction without toxics (the
// relay's own copy moves it). While the connection runs it is what its
// bytes counters read: the kernel's count of bytes received also has
// what the toxics dropped.
func (c *Conn) Passed() (up, down int64) {
	if c == nil {
		return -1, -1
	}
	return c.up.passedSoFar(), c.down.passedSoFar()
}

func (p *pipeline) passedSoFar() int64 {
	if p == nil {
		return -1
	}
	return p.passed.Load()
}

// Abort tells the connection's pipelines that the relay is resetting it
// (relay.Options.OnAbort): a delay ends, and none starts. Without it a
// delay's own write deadline went over the past one the relay's abort set,
// and the direction went on delivering what it held at the toxic's pace.
func (c *Conn) Abort() {
	for _, p := range []*pipeline{c.up, c.down} {
		if p != nil {
			p.aborted.Store(true)
		}
	}
}
