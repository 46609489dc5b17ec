package faults

import (
	"container/heap"
	"net/netip"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// delayLine sends a stream's delayed datagrams when they are due, one at a
// time, in due order and, when due alike, in the order they came: a fixed
// latency keeps a stream's order, as tc-netem's delay does, and only
// jitter (or a reorder toxic) reorders. A timer per datagram
// (time.AfterFunc) ran each send on a goroutine of its own, so datagrams
// delayed alike overtook each other (26 inversions in 1,000 at 2,000
// datagrams/s with latency 50 ms and no jitter). Its goroutine runs only
// while datagrams wait. The zero value is ready.
type delayLine struct {
	mu      sync.Mutex
	q       delayQueue
	bytes   int    // held in q
	n       uint64 // datagrams added, for arrival order
	running bool
	wake    chan struct{} // an earlier datagram than the one waited for
	// full: a datagram found the line at its bound, and it has not
	// drained to half since (said once per such episode, not per
	// datagram: a line held at its bound lets one in per send).
	full bool
	// budget is the process's bound on what faults hold
	// (--fault-max-buffered-bytes), which the line's bytes count in with
	// the faulted TCP directions; nil: none. Set before the first add.
	budget *bufferBudget
}

// A delay line holds at most delayLineMaxDatagrams datagrams and
// delayLineMaxBytes bytes; a datagram beyond either is dropped, as tc-netem
// drops past its queue's limit. UDP has no back-pressure, so without a
// bound one client of a port with a latency toxic made the proxy hold
// whatever it sent for the whole delay: 60,000-byte datagrams under 8 s of
// latency took the process from 32 to 688 MB. netem's default limit, 1,000
// packets, would drop at 20,000 datagrams/s under 50 ms; 10,000 holds
// 100,000/s under 100 ms.
const (
	delayLineMaxDatagrams = 10000
	delayLineMaxBytes     = 16 << 20
)

type delayedDatagram struct {
	due  time.Time
	n    uint64
	id   datagramID
	b    []byte
	send func([]byte)
}

// datagramID is what a draw needs of a datagram: its number in its stream
// and its client, so that a down toxic added later drops the delayed
// datagrams it draws.
type datagramID struct {
	seq    uint64
	client netip.AddrPort
}

// add queues b for send at due; b is the line's from now on. It reports
// false when the line is at its bound and b is dropped.
func (l *delayLine) add(due time.Time, id datagramID, b []byte, send func([]byte)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A line holding nothing takes one over the process's bound, as a TCP
	// direction holding nothing still reads: no port is shut out by what
	// others hold.
	if len(l.q) >= delayLineMaxDatagrams || l.bytes+len(b) > delayLineMaxBytes || !l.budget.hold(int64(len(b)), len(l.q) == 0) {
		if !l.full {
			l.full = true
			held, maxHeld := l.budget.counts()
			klog.V(2).InfoS("UDP latency toxic: datagrams dropped while the delay line, or what faults hold together, is at its maximum",
				"datagrams", len(l.q), "bytes", l.bytes, "maxDatagrams", delayLineMaxDatagrams, "maxBytes", delayLineMaxBytes,
				"faultsBufferedBytes", held, "faultMaxBufferedBytes", maxHeld)
		}
		return false
	}
	if l.full && len(l.q) < delayLineMaxDatagrams/2 && l.bytes < delayLineMaxBytes/2 {
		l.full = false // the episode is over once the line drained to half
	}
	heap.Push(&l.q, delayedDatagram{due: due, n: l.n, id: id, b: b, send: send})
	l.bytes += len(b)
	l.n++
	switch {
	case !l.running:
		if l.wake == nil {
			l.wake = make(chan struct{}, 1)
		}
		l.running = true
		go l.run()
	case l.q[0].n == l.n-1: // the new one is now first: wait less
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// drop discards the datagrams the line holds that drops reports (nil:
// every one).
func (l *delayLine) drop(drops func(datagramID) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.q[:0]
	freed := 0
	for _, d := range l.q {
		if drops != nil && !drops(d.id) {
			kept = append(kept, d)
			continue
		}
		freed += len(d.b)
	}
	l.bytes -= freed
	l.budget.give(int64(freed))
	clear(l.q[len(kept):])
	l.q = kept
	heap.Init(&l.q)
	if len(l.q) < delayLineMaxDatagrams/2 && l.bytes < delayLineMaxBytes/2 {
		l.full = false
	}
	if l.running {
		select { // its goroutine ends instead of waiting for nothing
		case l.wake <- struct{}{}:
		default:
		}
	}
}

func (l *delayLine) run() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		l.mu.Lock()
		if len(l.q) == 0 {
			l.running = false
			l.mu.Unlock()
			return
		}
		wait := time.Until(l.q[0].due)
		if wait <= 0 {
			d := heap.Pop(&l.q).(delayedDatagram)
			l.bytes -= len(d.b)
			l.mu.Unlock()
			l.budget.give(int64(len(d.b)))
			d.send(d.b)
			continue
		}
		l.mu.Unlock()
		t.Reset(wait)
		select {
		case <-t.C:
		case <-l.wake:
		}
	}
}

// delayQueue is a min-heap by due time, then arrival.
type delayQueue []delayedDatagram

func (q delayQueue) Len() int { return len(q) }
func (q delayQueue) Less(i, j int) bool {
	if !q[i].due.Equal(q[j].due) {
		return q[i].due.Before(q[j].due)
	}
	return q[i].n < q[j].n
}
func (q delayQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *delayQueue) Push(x any)   { *q = append(*q, x.(delayedDatagram)) }
func (q *delayQueue) Pop() any {
	old := *q
	d := old[len(old)-1]
	old[len(old)-1] = delayedDatagram{}
	*q = old[:len(old)-1]
	return d
}

// len returns the bytes the line holds.
func (l *delayLine) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytes
}
