package faults

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// pipeline applies one direction's toxics, in order, to each chunk read
// from src. One reader goroutine stamps chunks with their arrival time so
// latency delays each chunk without serialising the stream behind it.
type pipeline struct {
	toxics []*compiled
	// rngs[i] is toxics[i]'s own generator for its per-chunk draws
	// (latency's jitter, slicer's sizes), seeded by that toxic's seed
	// and key and the connection's number; nil for a toxic that draws
	// nothing. One generator per stream, seeded by its first toxic, let
	// another toxic decide a toxic's draws: its own seed changed nothing
	// behind a slow_close, and adding a slicer re-drew a latency's jitter.
	rngs []*rand.Rand
	// per-direction state
	limitLeft int64 // limit_data: bytes still allowed; <0 = no limit
	blackhole bool  // timeout: drop everything
	// rate is the lowest bandwidth toxic's, in bytes/s (0 = none);
	// bwNextFree is when the bytes written so far are paid for. hold: a
	// bandwidth toxic's rate is 0, nothing is delivered.
	rate       float64
	bwNextFree time.Time
	hold       bool
	// holding are the bandwidth 0 toxics holding the stream that were not
	// removed since (releaseHold; under holdMu). Once the last one is,
	// released is set and the stream flows on, as Toxiproxy's removal
	// lets the held chunk through. inHold: the writer waits in the hold
	// (holdStream), which the release wakes (under wakeMu).
	holdMu           sync.Mutex
	holding          []*compiled
	released, inHold atomic.Bool
	// holdBound is how long a hold lasts once its source ended (the
	// relay's half-close bound; 0: for ever, as Toxiproxy); srcRaw is the
	// source, whose state the hold looks at (srcEnded).
	holdBound time.Duration
	srcRaw    syscall.RawConn
	// srcReset: the source was reset (srcResetErr), which queues behind
	// the held chunks; writing: the writer is in a write, which the
	// reader then wakes (write).
	srcReset    atomic.Bool
	srcResetErr error
	writing     atomic.Bool
	// writeTimeout bounds a write that makes no progress (write); 0:
	// none.
	writeTimeout time.Duration
	// timer ends the stream with onTimer (reset_peer, timeout): the
	// earliest of them, nil when none, due at end. Every wait ends by
	// end too, so a chunk held back by bandwidth or latency cannot
	// postpone it.
	timer   <-chan time.Time
	end     time.Time
	onTimer error
	// idleTimer is the timer when timeout drives it: each chunk that
	// reaches the stream starts it again, so the stream ends after
	// idleTimeout without data, as Toxiproxy's timeout (a time.After
	// per chunk), not at a fixed time after the connection's start.
	idleTimer   *time.Timer
	idleTimeout time.Duration
	// timeoutGone is closed when a timeout toxic of this stream is removed
	// (through the fault API or /reset, or from the Service's annotation:
	// holdRemoved): the stream then ends as when the
	// timeout runs out, as Toxiproxy's TimeoutToxic.Cleanup closes its
	// stub. Kept instead, a timeout 0 held the connection for ever, and
	// Toxiproxy's pattern "hang it, remove the toxic, the client sees EOF
	// and reconnects" hung. nil: the stream has no timeout toxic.
	timeoutGone chan struct{}
	goneOnce    sync.Once
	// resetAfter is reset_peer's timeout (the shortest of several), <0
	// when there is none: its clock starts at the stream's first chunk
	// (resetLater).
	resetAfter time.Duration
	// slowClose is how long slow_close holds the stream's close.
	slowClose time.Duration
	// slicer is the slicer toxic's cutting of the chunk being delivered.
	slicer slicing
	// passed is what the toxics let through to dst so far (Passed).
	passed atomic.Int64
	// budget is the process's bound on what faulted directions hold
	// (Table.SetMaxBufferedBytes); nil: none.
	budget *bufferBudget

	// dst is where the writer waits (sleep): parked on its write side,
	// not on a timer, so whatever ends the connection wakes it
	// (socketWait).
	dst *net.TCPConn
	at  socketWait
	// srcErr is why src failed once srcFailed is set: the relay closed
	// it, and the reader wakes the writer, so the end does not queue
	// behind delayed chunks (a peer's reset does).
	srcErr    error
	srcFailed atomic.Bool
	// aborted: the relay is resetting the connection (Conn.Abort).
	aborted atomic.Bool
	// other is the connection's other direction's pipeline (nil: none).
	// A cut here sets its srcCut before the relay ends its source with a
	// read deadline (relay.ErrCut), which it then takes as the source's
	// end: the close passes its toxics (slow_close), as Toxiproxy's other
	// link reads the end of the connection the toxic closed.
	other  *pipeline
	srcCut atomic.Bool
	// wakeMu makes the reader's wake-up (srcReset stored, then a past
	// deadline if the writer writes) one step against the writer's own
	// deadline and its look at the flags (sleep, write, writeNow).
	// Without it a reader descheduled between its look at writing and
	// its deadline set that deadline over the writer's next wait: a
	// latency wait after the write it meant to wake ended at once with a
	// WriteError (both peers reset, the held bytes lost).
	wakeMu sync.Mutex
}

func newPipeline(toxics []*compiled, seq uint64) *pipeline {
	p := &pipeline{toxics: toxics, limitLeft: -1, resetAfter: -1}
	for i, t := range toxics {
		switch {
		case t.Type == "timeout":
			p.timeoutGone = make(chan struct{})
		case t.Type == "bandwidth" && t.Attributes["rate"] == 0:
			p.holding = append(p.holding, t)
		case t.Type == "latency" && t.Attributes["jitter"] > 0,
			t.Type == "slicer" && t.Attributes["size_variation"] > 0:
			if p.rngs == nil {
				p.rngs = make([]*rand.Rand, len(toxics))
			}
			p.rngs[i] = streamRand(t.seed, t.key, seq)
		}
	}
	return p
}

// holdRemoved applies the removal of toxic k to the stream if k holds it:
// a timeout ends the stream, a bandwidth 0 lets it flow on once no other
// holds it (releaseHold); nil: no pipeline.
func (p *pipeline) holdRemoved(k holdKey) {
	if p == nil {
		return
	}
	for _, t := range p.toxics {
		if t.Name != k.name || t.origin != k.origin || t.Stream != k.stream {
			continue
		}
		switch t.Type {
		case "timeout":
			p.goneOnce.Do(func() { close(p.timeoutGone) })
		case "bandwidth":
			p.releaseHold(t)
		}
	}
}

// holdsUntilRemoved tells whether a toxic whose removal reaches the
// stream (a timeout, a bandwidth 0) applies to it; false for nil.
func (p *pipeline) holdsUntilRemoved() bool {
	if p == nil {
		return false
	}
	p.holdMu.Lock()
	defer p.holdMu.Unlock()
	return p.timeoutGone != nil || len(p.holding) > 0
}

// releaseHold takes the removed bandwidth toxic t off the stream's hold,
// if it holds it: once none is left the stream flows on, and a writer
// waiting in the hold is woken (a past deadline, as the reader's wake-up
// sets one; sleep tells it from a bound's by released).
func (p *pipeline) releaseHold(t *compiled) {
	p.holdMu.Lock()
	i := slices.Index(p.holding, t)
	if i >= 0 {
		p.holding = slices.Delete(p.holding, i, i+1)
	}
	last := i >= 0 && len(p.holding) == 0
	p.holdMu.Unlock()
	if !last {
		return
	}
	p.wakeMu.Lock()
	p.released.Store(true)
	if p.inHold.Load() {
		_ = p.dst.SetWriteDeadline(time.Unix(1, 0))
	}
	p.wakeMu.Unlock()
}

type chunk struct {
	buf *[]byte // nil for an error alone
	n   int
	at  time.Time
	err error
}

func (p *pipeline) readChunks(src *net.TCPConn, q *chunkQueue) {
	for {
		if !q.waitSpace() {
			return
		}
		bp := relay.GetBuffer()
		n, err := src.Read(*bp)
		if errors.Is(err, os.ErrDeadlineExceeded) && p.srcCut.Load() && !p.aborted.Load() {
			err = io.EOF // the other direction's cut ended src (other)
		}
		if errors.Is(err, net.ErrClosed) {
			// The relay closed src: the connection is over, and the
			// writer must not go on waiting to deliver. A peer's reset
			// instead queues behind the chunks held before it, as a FIN
			// does: over a slow link the bytes sent before a reset
			// arrive before it. A deadline is the relay's to act on: its
			// bound also set one on dst, which wakes the writer; its
			// quiet close wants what is delayed delivered before the FIN.
			p.srcErr = err
			p.srcFailed.Store(true)
			_ = p.dst.SetWriteDeadline(time.Unix(1, 0))
		} else if err != nil && err != io.EOF && !errors.Is(err, os.ErrDeadlineExceeded) {
			// The source was reset: a write waiting on a destination
			// that reads nothing must not outlast it (write).
			p.wakeMu.Lock()
			p.srcResetErr = err
			p.srcReset.Store(true)
			if p.writing.Load() {
				_ = p.dst.SetWriteDeadline(time.Unix(1, 0))
			}
			p.wakeMu.Unlock()
		}
		if !q.push(chunk{buf: rightSized(bp, n), n: n, at: time.Now(), err: err}) || err != nil {
			return
		}
	}
}

// copy is the relay.Copier of a faulted direction.
func (p *pipeline) copy(dst, src *net.TCPConn) (int64, error) {
	var end time.Duration = -1
	for _, t := range p.toxics {
		switch t.Type {
		case "timeout":
			p.blackhole = true
			if d := t.ms("timeout"); d > 0 && (end < 0 || d < end) {
				end, p.onTimer = d, relay.ErrCut
			}
		case "reset_peer":
			if d := max(t.ms("timeout"), 0); p.resetAfter < 0 || d < p.resetAfter {
				p.resetAfter = d
			}
		case "limit_data":
			b := int64(t.Attributes["bytes"])
			if p.limitLeft < 0 || b < p.limitLeft {
				p.limitLeft = b
			}
		case "slow_close":
			p.slowClose = addDelay(p.slowClose, t.ms("delay"))
		case "bandwidth":
			// Several bandwidth toxics: the narrowest one limits.
			if r := t.Attributes["rate"] * 1000; r == 0 {
				p.hold = true
			} else if p.rate == 0 || r < p.rate {
				p.rate = r
			}
		}
	}
	// limit_data 0 cuts when the first chunk arrives, as Toxiproxy's: cut
	// at accept, the client's first bytes were still unread in its socket,
	// so the close sent a reset instead of a FIN.
	if end >= 0 {
		p.end = time.Now().Add(end)
		t := time.NewTimer(end)
		defer t.Stop()
		p.timer = t.C
		p.idleTimer, p.idleTimeout = t, end
	}
	p.dst = dst
	if err := p.at.init(dst); err != nil {
		return 0, &relay.WriteError{Err: err}
	}
	total, err := p.pump(dst, src)
	if errors.Is(err, relay.ErrCut) && p.slowClose > 0 {
		// slow_close delays every close of its stream, also one a toxic
		// chose (limit_data, timeout), as Toxiproxy's holds whatever
		// close comes down the chain to it.
		p.timer = nil
		if err := p.sleep(p.slowClose); err != nil {
			return total, err
		}
	}
	if errors.Is(err, relay.ErrCut) && p.other != nil {
		p.other.srcCut.Store(true)
	}
	return total, err
}

// pump moves src's chunks through the toxics to dst until the stream ends.
func (p *pipeline) pump(dst, src *net.TCPConn) (int64, error) {
	raw, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	p.srcRaw = raw
	q := newChunkQueue(p.budget)
	defer q.close()
	go p.readChunks(src, q)
	var total int64
	for {
		c, ok := q.pop()
		if !ok {
			select {
			case <-p.timer:
				return total, p.onTimer
			case <-p.timeoutGone:
				return total, relay.ErrCut
			case <-q.ready:
				continue
			}
		}
		if c.n > 0 && p.idleTimer != nil {
			// A timer's Reset leaves no stale tick behind (Go 1.23).
			p.idleTimer.Reset(p.idleTimeout)
			p.end = time.Now().Add(p.idleTimeout)
		}
		if p.resetAfter >= 0 && (c.n > 0 || c.err == io.EOF) {
			q.release(c)
			return total, p.resetLater()
		}
		if c.n > 0 {
			n, err := p.deliver(dst, c)
			total += n
			if err != nil {
				q.release(c)
				return total, err
			}
		}
		q.release(c)
		if c.err == io.EOF {
			// The stream ended: a timeout's timer no longer applies
			// (Toxiproxy's passes its input's close at once), so it
			// neither cuts the slow close short nor doubles it.
			p.timer = nil
			if err := p.sleep(p.slowClose); err != nil {
				return total, err
			}
			return total, nil
		}
		if c.err != nil {
			return total, c.err
		}
	}
}

// resetLater ends a reset_peer stream once it brought its first chunk (or
// its end), as Toxiproxy's toxic does: that chunk and everything after it
// are dropped, and both sides are reset resetAfter later, unless an earlier
// timer (timeout) or the connection's own end comes first. Counted from the
// connection's start instead, a request and its answer went through before
// the reset, so a client that asked at once was never reset.
func (p *pipeline) resetLater() error {
	if p.resetAfter == 0 {
		return relay.ErrReset
	}
	if at := time.Now().Add(p.resetAfter); p.timer == nil || at.Before(p.end) {
		p.end, p.onTimer = at, relay.ErrReset
	}
	if err := p.sleep(time.Until(p.end)); err != nil {
		return err
	}
	return p.onTimer
}

// deliver runs one chunk through the toxics and writes what is left.
func (p *pipeline) deliver(dst *net.TCPConn, c chunk) (int64, error) {
	data := (*c.buf)[:c.n]
	if p.blackhole {
		return 0, nil
	}
	if p.hold && !p.released.Load() {
		if err := p.holdStream(); err != nil {
			return 0, err
		}
	}
	var sliceDelay time.Duration
	var slicer *slicing
	// ready is when the chunk was due at the bandwidth stage: read, plus
	// its latency. Pacing from it, not from when this goroutine got to
	// run, keeps scheduling delays from adding up over a long transfer.
	ready := c.at
	// Chained latency toxics add up, as in Toxiproxy: each is a stage the
	// chunk passes after the one before (jitter never takes it back).
	var latency time.Duration
	for i, t := range p.toxics {
		switch t.Type {
		case "latency":
			d := t.ms("latency")
			if j := t.ms("jitter"); j > 0 {
				d += time.Duration((2*p.rngs[i].Float64() - 1) * float64(j))
			}
			latency = addDelay(latency, d)
			due := c.at.Add(latency)
			if due.After(ready) {
				ready = due
			}
			if err := p.sleep(time.Until(due)); err != nil {
				return 0, err
			}
		case "slicer":
			slicer = &p.slicer
			slicer.size = int(t.Attributes["average_size"])
			slicer.variation = int(t.Attributes["size_variation"])
			if slicer.variation > 0 {
				slicer.rand = p.rngs[i]
			}
			sliceDelay = time.Duration(t.Attributes["delay"] * float64(time.Microsecond))
		}
	}
	// Without a slicer, bandwidth writes 50 ms worth at a time, so the
	// rate holds at any scale instead of in bursts of one read.
	rateSlice := 0
	if p.rate > 0 {
		rateSlice = max(int(p.rate/20), 1)
	}
	// The slicer cuts the whole chunk, and limit_data, after it, ends
	// the stream within the slice that spends its budget.
	if slicer != nil {
		slicer.begin(len(data))
	}
	cut := false
	if p.limitLeft >= 0 && int64(len(data)) >= p.limitLeft {
		data, cut = data[:p.limitLeft], true
	}
	var total int64
	for len(data) > 0 {
		n := len(data)
		switch {
		case slicer != nil:
			n = min(slicer.next(), len(data))
		case rateSlice > 0:
			n = min(rateSlice, len(data))
		}
		// Paced before the write: each slice waits its own time at the
		// rate, so a message that fits in one write is as late as a bulk
		// stream's bytes.
		if err := p.pace(n, ready); err != nil {
			return total, err
		}
		w, err := p.write(dst, data[:n])
		total += int64(w)
		p.passed.Add(int64(w))
		if p.limitLeft >= 0 {
			p.limitLeft -= int64(w)
		}
		if err != nil {
			return total, err
		}
		data = data[n:]
		// After every slice, a chunk's last (or only) one too, as
		// Toxiproxy's slicer delays each packet: the next chunk waits.
		// Only between slices, a chunk no larger than average_size
		// was never delayed. Not after the slice limit_data ends on.
		if len(data) > 0 || !cut {
			if err := p.sleep(sliceDelay); err != nil {
				return total, err
			}
		}
	}
	if cut {
		return total, relay.ErrCut
	}
	return total, nil
}

// write writes b to dst; an error is what ends the stream: the source's
// (the reader's wake-up) or a *relay.WriteError. Once the source has
// reset, the reset waits for the chunks held before it but not for a
// destination that reads nothing: a write then passes what dst takes at
// once, and one that would wait, or was waiting when the reset came, ends
// the stream with the source's error, as the built-in copy's read of a
// reset source does. Otherwise a destination that stopped reading kept
// the connection past its source's reset, for as long as it did not read.
//
// A write that makes no progress for writeTimeout ends the connection with
// a reset to both peers, as the built-in copies' --tcp-write-timeout does;
// each byte written restarts it. One that makes none for stallLook looks
// whether the source was reset (srcResetBehind): its reader may read it
// no more (the queue is full), and the reset then waited for that bound.
func (p *pipeline) write(dst *net.TCPConn, b []byte) (int, error) {
	p.writing.Store(true)
	defer p.writing.Store(false)
	total := 0
	// progress is when the bound last started: the write's start, or
	// the deadline step that saw bytes go in. A Write under a deadline
	// tells of progress only when it returns, so the deadline is armed
	// in steps of a quarter bound: armed for the whole bound, a write
	// that took a byte just after it was armed and none since was cut
	// nearly two bounds after that byte (2.1 s with a 1 s bound).
	progress := time.Now()
	for {
		if p.srcReset.Load() {
			n, err := p.writeNow(b)
			return total + n, err
		}
		step := stallLook
		if p.writeTimeout > 0 {
			step = min(step, max(p.writeTimeout/4, time.Millisecond))
		}
		due := time.Now().Add(step)
		if end := progress.Add(p.writeTimeout); p.writeTimeout > 0 && end.Before(due) {
			due = end
		}
		p.wakeMu.Lock()
		err := dst.SetWriteDeadline(due)
		// After the deadline is set: an abort, or the reader's wake-up,
		// from now on sets its own over it; one that came before is seen
		// here.
		aborted, reset := p.aborted.Load(), p.srcReset.Load()
		p.wakeMu.Unlock()
		switch {
		case err != nil:
			return total, &relay.WriteError{Err: err}
		case aborted:
			return total, errAborted
		case reset:
			continue
		}
		n, err := dst.Write(b)
		total += n
		switch {
		case err == nil:
			return total, nil
		case p.srcFailed.Load():
			return total, p.srcErr
		case !errors.Is(err, os.ErrDeadlineExceeded) || p.aborted.Load():
		case p.srcReset.Load():
			return total, p.srcResetErr
		case n > 0:
			b, progress = b[n:], time.Now() // the bound starts again
			continue
		case p.writeTimeout <= 0 || time.Since(progress) < p.writeTimeout:
			// A step of the bound, not its end: a look at the source.
			if err := p.srcResetBehind(); err != nil {
				return total, err
			}
			continue
		}
		return total, &relay.WriteError{Err: err}
	}
}

// stallLook is how often a write that makes no progress looks at its
// source (srcResetBehind), as the built-in copy's does: a timer wake-up
// and a getsockopt per look, only while the destination takes nothing.
const stallLook = 250 * time.Millisecond

// srcResetBehind is the source's reset, if one came: a socket in CLOSE
// with its error still pending (SO_ERROR, which takes it). A source that
// reached CLOSE after a FIN each way has none; one whose error the other
// direction's write took ends through that write.
func (p *pipeline) srcResetBehind() error {
	if p.srcRaw == nil {
		return nil
	}
	var err error
	_ = p.srcRaw.Control(func(fd uintptr) {
		if rawio.TCPState(int(fd)) == rawio.TCPClose {
			err = rawio.SocketError(int(fd))
		}
	})
	return err
}

// writeNow writes what dst takes without waiting (write, after the
// source's reset).
func (p *pipeline) writeNow(b []byte) (int, error) {
	// The reader's wake-up may have come after the write it meant to
	// wake had finished; its past deadline would refuse this one. Under
	// wakeMu: the reader, which set srcReset, is done with its wake-up.
	// An abort is looked for after the deadline is cleared: one that came
	// before it is seen here, one after sets its own past deadline.
	p.wakeMu.Lock()
	err := p.dst.SetWriteDeadline(time.Time{})
	p.wakeMu.Unlock()
	switch {
	case err != nil:
		return 0, &relay.WriteError{Err: err}
	case p.aborted.Load():
		return 0, errAborted
	}
	var n int
	var werr error
	err = p.at.raw.Write(func(fd uintptr) bool {
		for n < len(b) && werr == nil {
			var m int
			m, werr = rawio.Send(int(fd), b[n:])
			n += max(m, 0)
		}
		return true
	})
	switch {
	case err != nil:
		return n, &relay.WriteError{Err: err}
	case errors.Is(werr, syscall.EAGAIN):
		return n, p.srcResetErr
	case werr != nil:
		return n, &relay.WriteError{Err: werr}
	}
	return n, nil
}

// holdStream holds the stream's data (bandwidth 0) until the connection
// ends, or until the toxics that hold it are removed (releaseHold): nil
// then, and the chunk goes on through the stream's other toxics, as
// Toxiproxy's removal lets the held chunk through (Testcontainers' cut
// connection restored). Meanwhile its reader stops at the queue's bound,
// so the source meets back-pressure, not loss.
func (p *pipeline) holdStream() error {
	p.inHold.Store(true)
	defer p.inHold.Store(false)
	poll := time.Hour
	if p.holdBound > 0 {
		poll = min(p.holdBound, holdPoll)
	}
	for {
		err := p.sleep(poll)
		if err == nil && p.srcEnded() {
			err = p.holdEnded()
		}
		if errors.Is(err, errReleased) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// errReleased ends a wait in the hold (holdStream): the toxics holding
// the stream were removed.
var errReleased = errors.New("faults: hold released")

// holdPoll is how often a hold looks at its source's state (srcEnded).
const holdPoll = time.Second

// srcEnded tells whether the source's peer reset or closed it, from the
// socket's state. A hold never takes the next chunk, where the source's
// end would come, and once its queue is full its reader reads nothing
// more either; so it looks (and would otherwise have waited for the other
// peer: a database's idle connection, for ever).
func (p *pipeline) srcEnded() bool {
	if p.srcCut.Load() {
		return true // the other direction's cut ended it
	}
	ended := false
	_ = p.srcRaw.Control(func(fd uintptr) {
		st := rawio.TCPState(int(fd))
		ended = st == rawio.TCPClose || st == rawio.TCPCloseWait
	})
	return ended
}

// holdEnded ends a held stream whose source ended: unless the toxics
// holding it are removed meanwhile (errReleased), what it holds is never
// delivered, nor the end after it, and no direction of the relay ended,
// so its half-close bound never ran (a client that gave up and closed left
// the connection, its goroutines and its slot until the backend closed an
// idle connection: with a database, never). After holdBound both peers are
// reset (a FIN would pass the lost bytes off as a clean end).
func (p *pipeline) holdEnded() error {
	if p.holdBound <= 0 {
		for {
			if err := p.sleep(time.Hour); err != nil {
				return err
			}
		}
	}
	if err := p.sleep(p.holdBound); err != nil {
		return err
	}
	return relay.ErrReset
}

// pace waits until n more bytes are paid for at the bandwidth rate (KB/s,
// 1 KB = 1000 bytes as in Toxiproxy), over the whole stream, not per
// chunk: an idle source earns no credit (pacing restarts when a chunk is
// ready after the bytes before it were paid for), a late wake-up is caught
// up. An error ends the stream (sleep).
func (p *pipeline) pace(n int, ready time.Time) error {
	if p.rate == 0 {
		return nil
	}
	if p.bwNextFree.Before(ready) {
		p.bwNextFree = ready
	}
	p.bwNextFree = p.bwNextFree.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	return p.sleep(time.Until(p.bwNextFree))
}

// errAborted ends a direction the relay is resetting: what a write would
// have met at the abort's deadline.
var errAborted = &relay.WriteError{Err: os.ErrDeadlineExceeded}

// sleep waits d. An error ends the stream: the stream's timer fired
// (onTimer), src failed (the reader's error), or dst is done for: closed
// (net.ErrClosed: whoever closed it decides how the peers learn), a
// deadline the relay set (a bound ran out), or reset by its peer.
func (p *pipeline) sleep(d time.Duration) error {
	if d <= 0 {
		return nil
	}
	until, timerFirst := time.Now().Add(d), false
	if p.timer != nil && !p.end.After(until) {
		until, timerFirst = p.end, true
	}
	p.wakeMu.Lock()
	err := p.dst.SetWriteDeadline(until)
	// After the deadline is set: a reader failing, the relay aborting, or
	// a hold's release, from now on sets its own over it, which wakes the
	// wait below; one that came before is seen here (the deadline just
	// set went over it).
	aborted, failed := p.aborted.Load(), p.srcFailed.Load()
	released := p.inHold.Load() && p.released.Load()
	p.wakeMu.Unlock()
	switch {
	case err != nil:
		return &relay.WriteError{Err: err}
	case aborted:
		return errAborted
	case failed:
		return p.srcErr
	case released:
		return errReleased
	}
	err = p.at.wait(until)
	switch {
	case p.aborted.Load():
		// Also when the wait took the abort's deadline for its own and
		// cleared it.
		return errAborted
	case p.srcFailed.Load():
		return p.srcErr
	case timerFirst && errors.Is(err, errWaitedOut):
		return p.onTimer
	case errors.Is(err, errWaitedOut):
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded) && p.inHold.Load() && p.released.Load():
		return errReleased // the next wait or write sets its own deadline
	}
	return &relay.WriteError{Err: err}
}

// slicing cuts a chunk into slices as Toxiproxy's slicer does
// (SlicerToxic.chunk): a piece longer than average_size + size_variation
// is halved, its middle moved by a draw within ± size_variation, and each
// half is cut alike, left first; so 100 bytes at average_size 10 go as 16
// writes of 6 or 7 bytes, and 15 bytes as 7 and 8. Slices of
// average_size ± size_variation each, with the rest last, made 10 writes
// of 10 and 10 + 5 there: other sizes and counts than a test written
// against Toxiproxy saw. Depth first, one piece at a time, so a chunk's
// slices are never all held: the pieces still to cut are a stack.
type slicing struct {
	size, variation int
	// rand is the toxic's own generator (nil without size_variation).
	rand *rand.Rand
	// from is where the next slice starts; pending are the ends of the
	// pieces still to cut, the next one last.
	from    int
	pending []int
}

// begin starts cutting a chunk of n bytes.
func (s *slicing) begin(n int) {
	s.from = 0
	s.pending = append(s.pending[:0], n)
}

// next returns the length of the chunk's next slice (begin's n in all).
func (s *slicing) next() int {
	end := s.pending[len(s.pending)-1]
	s.pending = s.pending[:len(s.pending)-1]
	for end-s.from-s.size > s.variation {
		mid := s.from + (end-s.from)/2
		if s.variation > 0 {
			mid += s.rand.IntN(2*s.variation) - s.variation
		}
		// Toxiproxy's middle may fall outside the piece when
		// size_variation exceeds half of it (its server then crashes).
		mid = min(max(mid, s.from+1), end-1)
		s.pending = append(s.pending, end)
		end = mid
	}
	n := end - s.from
	s.from = end
	return n
}
