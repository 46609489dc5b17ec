package faults

import (
	"sync"

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
// order, within chunkBudget. It grows with what is queued rather than
// being sized for the most chunks the budget allows.
type chunkQueue struct {
	mu     sync.Mutex
	q      []chunk
	head   int
	held   int           // the queued and in-hand chunks' cost
	closed bool          // the writer returned
	ready  chan struct{} // cap 1: a chunk was queued
	space  chan struct{} // cap 1: held went down, or closed
}

func newChunkQueue() *chunkQueue {
	return &chunkQueue{ready: make(chan struct{}, 1), space: make(chan struct{}, 1)}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// waitSpace waits until the budget has room for a read; false: the writer
// returned.
func (q *chunkQueue) waitSpace() bool {
	for {
		q.mu.Lock()
		closed, room := q.closed, q.held+readBufSize+chunkOverhead <= chunkBudget
		q.mu.Unlock()
		if closed {
			return false
		}
		if room {
			return true
		}
		<-q.space
	}
}

// push queues c; false (c's buffer returned) when the writer returned.
func (q *chunkQueue) push(c chunk) bool {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		putChunkBuffer(c.buf)
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
	q.held += chunkCost(c)
	q.mu.Unlock()
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
	q.mu.Lock()
	q.held -= chunkCost(c)
	q.mu.Unlock()
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
	q.q, q.head, q.held = nil, 0, 0
	q.mu.Unlock()
	signal(q.space)
}
