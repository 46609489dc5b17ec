package config

import (
	"time"

	"k8s.io/utils/clock"
)

// settleWindow is the wait between the first event of a burst of writes and
// the reload that reads them. A tool writing a new file (vim, emacs, git)
// writes it in pieces, and a reload a fixed time after the first event read
// one save in 40 of a 5,000-Service file half written; so the window lasts
// until no manifest has had an event for settle. Events on other names (a
// ConfigMap volume's ..data swap, an editor's swap file) open the window but
// do not extend it, and nothing extends it past max after its first event.
type settleWindow struct {
	clock          clock.Clock
	settle, max    time.Duration
	timer          clock.Timer
	c              <-chan time.Time // nil while no window is open
	first, lastHit time.Time        // the window's first event, its last on a manifest
}

func newSettleWindow(c clock.Clock, settle time.Duration) *settleWindow {
	return &settleWindow{clock: c, settle: settle, max: 10 * settle}
}

// open starts a window at now unless one is open already.
func (w *settleWindow) open(now time.Time) {
	if w.c != nil {
		return
	}
	w.first = now
	w.arm(w.settle)
}

// manifestEvent extends the open window: a manifest had an event at now.
func (w *settleWindow) manifestEvent(now time.Time) { w.lastHit = now }

// isOpen says whether files are being written: a reload now would read
// them half written.
func (w *settleWindow) isOpen() bool { return w.c != nil }

// fired is called when C fires. It re-arms the window and returns false
// while it must last longer, else closes it and returns true: reload now.
func (w *settleWindow) fired() bool {
	now := w.clock.Now()
	if wait := min(w.lastHit.Add(w.settle).Sub(now), w.first.Add(w.max).Sub(now)); wait > 0 {
		w.arm(wait)
		return false
	}
	w.c = nil
	return true
}

func (w *settleWindow) arm(d time.Duration) {
	w.timer = w.clock.NewTimer(d)
	w.c = w.timer.C()
}

func (w *settleWindow) stop() {
	if w.c != nil {
		w.timer.Stop()
		w.c = nil
	}
}

// oneShot is a timer that may be unset: C is nil then, so a select on it
// never fires.
type oneShot struct {
	clock clock.Clock
	timer clock.Timer
	c     <-chan time.Time
}

// set replaces any pending time with d from now.
func (t *oneShot) set(d time.Duration) {
	t.stop()
	t.timer = t.clock.NewTimer(d)
	t.c = t.timer.C()
}

func (t *oneShot) stop() {
	if t.timer != nil {
		t.timer.Stop()
		t.timer, t.c = nil, nil
	}
}
