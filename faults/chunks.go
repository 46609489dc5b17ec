package faults

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// chunkBudget bounds what a faulted direction holds in flight (read, not
// yet written): the bytes of the buffers its chunks hold plus
// chunkOverhead each. It is what a latency toxic lets through per delay:
// 4 MiB a second under 1,000 ms. A count of 16 chunks capped a stream at
// about 576 KiB per delay (5,000,000 bytes under 1 s took 9 s); Toxiproxy
// queues 1,024 chunks of up to 32 KiB. Once it is spent the reader stops
// reading, and the source's TCP window holds it back.
const (
	chunkBudget   = 4 << 20
	chunkOverhead = 128 // a queued chunk and its buffer's header
)

// readBufSize is what the reader reads into (relay's copy buffer); it
// waits until the budget has room for a whole one.
const readBufSize = relay.CopyBufSize

// readCost is what a read takes of the process's budget (bufferBudget)
// until what it read is known.
const readCost = readBufSize + chunkOverhead

// bufferBudget bounds what every faulted direction of the process holds
// together (--fault-max-buffered-bytes): the chunks of its queue, as
// chunkBudget counts them, and its read in progress (readCost). Without
// it each direction of a latency-faulted stream held its 4 MiB: 300
// clients of one such Service took the proxy from 32 MB to 1.27 GB.
//
// Once it is spent, a reader waits in line (first come, first served)
// and its source meets TCP back-pressure, as behind a slow peer. A
// direction that holds nothing always reads, over the budget if need be,
// so a stream is never stalled by what others hold (a bandwidth 0 hold
// never gives its bytes back): the bound is the budget plus one read per
// faulted direction, which each connection's copy buffers cost anyway.
// The zero value and nil have no bound; held is still counted.
type bufferBudget struct {
	max  int64 // 0: no bound
	held atomic.Int64
	// waiting is len(line), read without mu by give.
	waiting atomic.Int32
	mu      sync.Mutex
	line    []*chunkQueue // readers waiting for room, oldest first
	// high: held went over trimAbove since the last trim; trimming: a
	// trim's goroutine runs, and trimAgain asks it for one more.
	high, trimming, trimAgain atomic.Bool
}

// Once what faulted directions hold falls from over trimAbove to under
// trimBelow, the heap is collected and given back to the system, at most
// once per trimEvery: otherwise what a burst of faulted connections held
// stayed in the process after they ended, as pooled buffers (an idle
// process collects only every 2 minutes, and a pooled buffer goes at its
// second collection): 1.27 GB for 4 minutes after 300 latency-faulted
// streams ended, 0.3 GB with the default bound.
const (
	trimAbove = 64 << 20
	trimBelow = 8 << 20
)

var (
	trimEvery    = 30 * time.Second
	trimAfter    = time.Second // for the connections of a burst to end
	freeOSMemory = debug.FreeOSMemory
)

// took notes a burst: held is what faulted directions hold after a take.
func (b *bufferBudget) took(held int64) {
	if held > trimAbove && !b.high.Load() {
		b.high.Store(true)
	}
}

// trimSoon gives the heap back trimAfter from now, or once the trim
// running has waited out its trimEvery.
func (b *bufferBudget) trimSoon() {
	b.trimAgain.Store(true)
	if !b.trimming.CompareAndSwap(false, true) {
		return
	}
	after, every, free := trimAfter, trimEvery, freeOSMemory
	go func() {
		for {
			for b.trimAgain.Swap(false) {
				time.Sleep(after)
				// Twice: a pooled buffer survives one collection.
				free()
				free()
				time.Sleep(every)
			}
			b.trimming.Store(false)
			// A trimSoon that found this one still running.
			if !b.trimAgain.Load() || !b.trimming.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// take reserves a read for q's reader: at once when the budget has room
// and nobody waits before it, or when force (q holds nothing), or when
// give granted it one while it waited; otherwise q waits in line and
// take reports false (q.space is signalled at the grant).
func (b *bufferBudget) take(q *chunkQueue, force bool) bool {
	if b == nil {
		return true
	}
	if !q.waited {
		// Without the lock while nobody waits: a read per chunk.
		if b.max <= 0 || force {
			b.took(b.held.Add(readCost))
			return true
		}
		for b.waiting.Load() == 0 {
			held := b.held.Load()
			if held+readCost > b.max {
				break
			}
			if b.held.CompareAndSwap(held, held+readCost) {
				b.took(held + readCost)
				return true
			}
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case q.granted:
		q.granted, q.waited = false, false
		return true
	case force:
		if q.inLine {
			b.leaveLine(q)
		}
		q.waited = false
		b.took(b.held.Add(readCost))
		return true
	case !q.inLine:
		// In line before the look at held below, so that a give that
		// freed room since either sees the line or is seen there (it
		// looks at waiting after its subtraction).
		b.line = append(b.line, q)
		q.inLine = true
		b.waiting.Add(1)
	}
	if b.line[0] == q && b.room() {
		b.leaveLine(q)
		q.waited = false
		b.took(b.held.Add(readCost))
		return true
	}
	q.waited = true
	return false
}

func (b *bufferBudget) room() bool { return b.held.Load()+readCost <= b.max }

// hold counts n bytes held outside a chunk queue (a UDP delay line's
// datagram), which cannot wait in line: it reports false, counting
// nothing, when they would take what is held past the bound, unless
// force.
func (b *bufferBudget) hold(n int64, force bool) bool {
	if b == nil {
		return true
	}
	if !force && b.max > 0 && b.held.Load()+n > b.max {
		return false
	}
	b.took(b.held.Add(n))
	return true
}

// counts returns what is held and the bound (0: none).
func (b *bufferBudget) counts() (held, max int64) {
	if b == nil {
		return 0, 0
	}
	return b.held.Load(), b.max
}

// give returns n bytes to the budget, and grants the readers in line
// what room it made.
func (b *bufferBudget) give(n int64) {
	if b == nil {
		return
	}
	if held := b.held.Add(-n); held < trimBelow && b.high.Load() && b.high.CompareAndSwap(true, false) {
		b.trimSoon()
	}
	if b.max <= 0 || b.waiting.Load() == 0 {
		return
	}
	b.mu.Lock()
	for len(b.line) > 0 && b.room() {
		q := b.line[0]
		b.leaveLine(q)
		q.granted = true
		b.took(b.held.Add(readCost))
		signal(q.space)
	}
	b.mu.Unlock()
}

// leave takes q's reader out of line when its queue closed, with the
// read it was granted, if any.
func (b *bufferBudget) leave(q *chunkQueue) {
	if b == nil || b.max <= 0 {
		return
	}
	b.mu.Lock()
	granted := q.granted
	q.granted = false
	if q.inLine {
		b.leaveLine(q)
	}
	b.mu.Unlock()
	if granted {
		b.give(readCost)
	}
}

// leaveLine takes q out of line; under mu.
func (b *bufferBudget) leaveLine(q *chunkQueue) {
	if b.line[0] == q {
		// Grants take the head: no copy of a long line per grant.
		b.line[0] = nil
		b.line = b.line[1:]
	} else {
		i := 1
		for b.line[i] != q {
			i++
		}
		copy(b.line[i:], b.line[i+1:])
		b.line[len(b.line)-1] = nil
		b.line = b.line[:len(b.line)-1]
	}
	q.inLine = false
	b.waiting.Add(-1)
}

// A short read is copied into a pooled buffer of the smallest of these
// sizes that holds it, and the read buffer goes back at once: 500
// connections with 25 one-byte chunks each delayed held a 32 KiB buffer
// per chunk, 302 MB.
var chunkSizes = [...]int{256, 2 << 10, 16 << 10}

var chunkPools [len(chunkSizes)]sync.Pool

func init() {
	for i, size := range chunkSizes {
		chunkPools[i].New = func() any { b := make([]byte, size); return &b }
	}
}

// rightSized returns a buffer holding bp's first n bytes: bp itself for
// a long read, a smaller pooled one (bp returned) for a short one, nil
// for none.
func rightSized(bp *[]byte, n int) *[]byte {
	if n <= 0 {
		relay.PutBuffer(bp)
		return nil
	}
	for i, size := range chunkSizes {
		if n <= size {
			small := chunkPools[i].Get().(*[]byte)
			copy(*small, (*bp)[:n])
			relay.PutBuffer(bp)
			return small
		}
	}
	return bp
}

func putChunkBuffer(bp *[]byte) {
	if bp == nil {
		return
	}
	for i, size := range chunkSizes {
		if cap(*bp) == size {
			chunkPools[i].Put(bp)
			return
		}
	}
	relay.PutBuffer(bp)
}

func chunkCost(c chunk) int {
	if c.buf == nil {
		return chunkOverhead
	}
	return cap(*c.buf) + chunkOverhead
}

// chunkQueue hands chunks from a direction's reader to its writer, in
// order, within chunkBudget and the process's budget. It grows with what
// is queued rather than being sized for the most chunks the budget
// allows.
type chunkQueue struct {
	mu     sync.Mutex
	q      []chunk
	head   int
	held   int           // the queued and in-hand chunks' cost
	closed bool          // the writer returned
	ready  chan struct{} // cap 1: a chunk was queued
	space  chan struct{} // cap 1: held went down, closed, or a read granted
	budget *bufferBudget
	// inLine, granted: the reader waits in budget's line, or was granted
	// a read there; under budget.mu. waited: take last reported false
	// (the reader's own).
	inLine, granted bool
	waited          bool
}

func newChunkQueue(b *bufferBudget) *chunkQueue {
	return &chunkQueue{ready: make(chan struct{}, 1), space: make(chan struct{}, 1), budget: b}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// waitSpace waits until both budgets have room for a read, which it
// reserves (push settles it); false: the writer returned.
func (q *chunkQueue) waitSpace() bool {
	for {
		q.mu.Lock()
		closed, held := q.closed, q.held
		q.mu.Unlock()
		if closed {
			q.budget.leave(q)
			return false
		}
		if held+readCost <= chunkBudget && q.budget.take(q, held == 0) {
			return true
		}
		<-q.space
	}
}

// push queues c, which takes the place of its read's reservation; false
// (c's buffer returned) when the writer returned.
func (q *chunkQueue) push(c chunk) bool {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		putChunkBuffer(c.buf)
		q.budget.give(readCost)
		return false
	}
	switch {
	case q.head > 0 && q.head == len(q.q):
		q.q, q.head = q.q[:0], 0
	case q.head >= 256 && 2*q.head >= len(q.q):
		// A queue that never empties (a steady stream under latency)
		// would otherwise grow for ever at its tail.
		n := copy(q.q, q.q[q.head:])
		clear(q.q[n:])
		q.q, q.head = q.q[:n], 0
	}
	q.q = append(q.q, c)
	cost := chunkCost(c)
	q.held += cost
	q.mu.Unlock()
	q.budget.give(int64(readCost - cost))
	signal(q.ready)
	return true
}

// pop takes the next chunk, which counts against the budget until
// release.
func (q *chunkQueue) pop() (chunk, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.q) {
		return chunk{}, false
	}
	c := q.q[q.head]
	q.q[q.head] = chunk{}
	q.head++
	return c, true
}

// release returns a popped chunk's buffer and its share of the budget.
func (q *chunkQueue) release(c chunk) {
	putChunkBuffer(c.buf)
	cost := chunkCost(c)
	q.mu.Lock()
	q.held -= cost
	q.mu.Unlock()
	q.budget.give(int64(cost))
	signal(q.space)
}

// close ends the queue when the writer returns: the queued buffers go
// back to their pools, and a reader waiting for room, or pushing later,
// stops.
func (q *chunkQueue) close() {
	q.mu.Lock()
	q.closed = true
	for i := q.head; i < len(q.q); i++ {
		putChunkBuffer(q.q[i].buf)
		q.q[i] = chunk{}
	}
	held := q.held
	q.q, q.head, q.held = nil, 0, 0
	q.mu.Unlock()
	q.budget.give(int64(held))
	signal(q.space)
}

// DefaultMaxBufferedBytes is --fault-max-buffered-bytes' default: what 64
// directions hold at their own bound of 4 MiB, so that up to 64 streams
// under latency keep their full rate (4 MiB per delay each), and that
// many more at once cost 256 MiB, not 4 MiB each (1.27 GB for 300).
const DefaultMaxBufferedBytes = 64 * chunkBudget

// SetMaxBufferedBytes bounds what the faulted directions of every port
// hold in flight together (--fault-max-buffered-bytes; 0: no bound). Set
// it before any Accept.
func (t *Table) SetMaxBufferedBytes(n int64) { t.buffers.max = n }

// BufferedBytes is what the faulted directions hold in flight now, and
// the bound (0: none).
func (t *Table) BufferedBytes() (held, max int64) { return t.buffers.held.Load(), t.buffers.max }
