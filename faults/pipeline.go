package faults

import (
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// pipeline applies one direction's toxics, in order, to each chunk read
// from src. One reader goroutine stamps chunks with their arrival time so
// latency delays each chunk without serialising the stream behind it.
type pipeline struct {
	toxics []*compiled
	rng    *rand.Rand
	// per-direction state
	limitLeft int64 // limit_data: bytes still allowed; <0 = no limit
	blackhole bool  // timeout: drop everything
	// rate is the lowest bandwidth toxic's, in bytes/s (0 = none);
	// bwNextFree is when the bytes written so far are paid for.
	rate       float64
	bwNextFree time.Time
	// timer ends the stream with onTimer (reset_peer, timeout): the
	// earliest of them, nil when none. Every wait selects on it, so a
	// chunk held back by bandwidth or latency cannot postpone it.
	timer   <-chan time.Time
	onTimer error
}

func newPipeline(toxics []*compiled, seq uint64) *pipeline {
	first := toxics[0]
	return &pipeline{toxics: toxics, rng: streamRand(first.seed, first.key, seq), limitLeft: -1}
}

type chunk struct {
	buf *[]byte
	n   int
	at  time.Time
	err error
}

// chunkQueue bounds what the reader may run ahead of the writer.
const chunkQueue = 16

func readChunks(src *net.TCPConn, out chan<- chunk, stop <-chan struct{}) {
	for {
		bp := relay.GetBuffer()
		n, err := src.Read(*bp)
		select {
		case out <- chunk{buf: bp, n: n, at: time.Now(), err: err}:
		case <-stop:
			relay.PutBuffer(bp)
			return
		}
		if err != nil {
			return
		}
	}
}

// copy is the relay.Copier of a faulted direction.
func (p *pipeline) copy(dst, src *net.TCPConn) (int64, error) {
	var (
		slowEOF time.Duration
		end     time.Duration = -1
	)
	for _, t := range p.toxics {
		switch t.Type {
		case "timeout":
			p.blackhole = true
			if d := t.ms("timeout"); d > 0 && (end < 0 || d < end) {
				end, p.onTimer = d, relay.ErrCut
			}
		case "reset_peer":
			d := t.ms("timeout")
			if d <= 0 {
				return 0, relay.ErrReset
			}
			if end < 0 || d < end {
				end, p.onTimer = d, relay.ErrReset
			}
		case "limit_data":
			b := int64(t.Attributes["bytes"])
			if p.limitLeft < 0 || b < p.limitLeft {
				p.limitLeft = b
			}
		case "slow_close":
			slowEOF = addDelay(slowEOF, t.ms("delay"))
		case "bandwidth":
			// Several bandwidth toxics: the narrowest one limits.
			if r := t.Attributes["rate"] * 1000; p.rate == 0 || r < p.rate {
				p.rate = r
			}
		}
	}
	// limit_data 0 cuts when the first chunk arrives, as Toxiproxy's: cut
	// at accept, the client's first bytes were still unread in its socket,
	// so the close sent a reset instead of a FIN.
	if end >= 0 {
		t := time.NewTimer(end)
		defer t.Stop()
		p.timer = t.C
	}
	chunks := make(chan chunk, chunkQueue)
	stop := make(chan struct{})
	defer close(stop)
	go readChunks(src, chunks, stop)
	var total int64
	for {
		select {
		case <-p.timer:
			return total, p.onTimer
		case c := <-chunks:
			if c.n > 0 {
				n, err := p.deliver(dst, c)
				total += n
				if err != nil {
					relay.PutBuffer(c.buf)
					return total, err
				}
			}
			relay.PutBuffer(c.buf)
			if c.err == io.EOF {
				if !p.sleep(slowEOF) {
					return total, p.onTimer
				}
				return total, nil
			}
			if c.err != nil {
				return total, c.err
			}
		}
	}
}

// deliver runs one chunk through the toxics and writes what is left.
func (p *pipeline) deliver(dst *net.TCPConn, c chunk) (int64, error) {
	data := (*c.buf)[:c.n]
	if p.blackhole {
		return 0, nil
	}
	var sliceSize, sliceVar int
	var sliceDelay time.Duration
	// ready is when the chunk was due at the bandwidth stage: read, plus
	// its latency. Pacing from it, not from when this goroutine got to
	// run, keeps scheduling delays from adding up over a long transfer.
	ready := c.at
	// Chained latency toxics add up, as in Toxiproxy: each is a stage the
	// chunk passes after the one before (jitter never takes it back).
	var latency time.Duration
	for _, t := range p.toxics {
		switch t.Type {
		case "latency":
			d := t.ms("latency")
			if j := t.ms("jitter"); j > 0 {
				d += time.Duration((2*p.rng.Float64() - 1) * float64(j))
			}
			latency = addDelay(latency, d)
			due := c.at.Add(latency)
			if due.After(ready) {
				ready = due
			}
			if !p.sleep(time.Until(due)) {
				return 0, p.onTimer
			}
		case "slicer":
			sliceSize = int(t.Attributes["average_size"])
			sliceVar = int(t.Attributes["size_variation"])
			sliceDelay = time.Duration(t.Attributes["delay"] * float64(time.Microsecond))
		}
	}
	if sliceSize == 0 && p.rate > 0 {
		// Writes of 50 ms worth each, so the rate holds at any scale
		// instead of in bursts of one read.
		sliceSize = max(int(p.rate/20), 1)
	}
	cut := false
	if p.limitLeft >= 0 && int64(len(data)) >= p.limitLeft {
		data, cut = data[:p.limitLeft], true
	}
	var total int64
	for len(data) > 0 {
		n := len(data)
		if sliceSize > 0 {
			n = sliceSize
			if sliceVar > 0 {
				n += p.rng.IntN(2*sliceVar+1) - sliceVar
			}
			n = min(max(n, 1), len(data))
		}
		w, err := dst.Write(data[:n])
		total += int64(w)
		if p.limitLeft >= 0 {
			p.limitLeft -= int64(w)
		}
		if err != nil {
			return total, &relay.WriteError{Err: err}
		}
		data = data[n:]
		if !p.pace(w, ready) {
			return total, p.onTimer
		}
		if len(data) > 0 && !p.sleep(sliceDelay) {
			return total, p.onTimer
		}
	}
	if cut {
		return total, relay.ErrCut
	}
	return total, nil
}

// pace holds the direction to the bandwidth rate (KB/s, 1 KB = 1000
// bytes as in Toxiproxy) over the whole stream, not per chunk: an idle
// source earns no credit (pacing restarts when a chunk is ready after
// the bytes before it were paid for), a late wake-up is caught up. False
// means the stream's timer fired meanwhile.
func (p *pipeline) pace(n int, ready time.Time) bool {
	if p.rate == 0 {
		return true
	}
	if p.bwNextFree.Before(ready) {
		p.bwNextFree = ready
	}
	p.bwNextFree = p.bwNextFree.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	return p.sleep(time.Until(p.bwNextFree))
}

// sleep waits d unless the stream's timer fires first (false).
func (p *pipeline) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	if p.timer == nil {
		time.Sleep(d)
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.timer:
		return false
	}
}
