package relay

import "container/heap"

// What a loop timer bounds (loopTimer.kind).
const (
	timerDial      uint8 = iota // the dial attempt in progress
	timerWriteUp                // client→backend cannot write (WriteTimeout)
	timerWriteDown              // backend→client cannot write
	timerHalf                   // one direction ended; the other's inactivity
	timerQuiet                  // CloseWhenQuiet's next check
	timerLiveness               // the backend socket's liveness options are due
	numTimers
)

// loopTimer is one of a connection's bounds, embedded in it (no allocation
// per arm). A bound that is pushed back often (the write bound on every
// bit of progress) keeps its entry and is re-armed when it comes due.
type loopTimer struct {
	c     *LoopConn
	at    int64 // loop time, ns
	index int   // in the heap; -1: not armed
	kind  uint8
}

// timerHeap orders the armed timers of one loop by due time.
type timerHeap []*loopTimer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*loopTimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}

// set arms t at at, or moves it there.
func (h *timerHeap) set(t *loopTimer, at int64) {
	t.at = at
	if t.index >= 0 {
		heap.Fix(h, t.index)
		return
	}
	heap.Push(h, t)
}

// stop disarms t.
func (h *timerHeap) stop(t *loopTimer) {
	if t.index >= 0 {
		heap.Remove(h, t.index)
	}
}

func (h timerHeap) next() (int64, bool) {
	if len(h) == 0 {
		return 0, false
	}
	return h[0].at, true
}

// popDue removes and returns the earliest timer due by now, or nil.
func (h *timerHeap) popDue(now int64) *loopTimer {
	if len(*h) == 0 || (*h)[0].at > now {
		return nil
	}
	return heap.Pop(h).(*loopTimer)
}
