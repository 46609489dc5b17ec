package relay

import "errors"

// Every loop of a Group accepts from the same listening socket, and the one
// that wakes first takes what is queued, up to acceptBatch at a time: 64
// clients connecting at once (wrk -c64) landed 63 to 1 on two loops in a
// quarter of the trials, and a kept-alive load then ran on one loop's
// thread while the other CPU idled. So a loop keeps a client it accepted
// only while it holds at most balanceSlack more connections than the
// lightest loop, and hands it to that loop otherwise. Under a steady load
// the loops stay within the slack of each other and nothing is handed
// over; a hand-off costs a command in the other loop's inbox (and its
// wake-up, if it was parked: the idle CPU is then put to work).

// ErrLoopStopped fails a client handed to a loop that stopped first, or
// still dialing when its loop stopped: the proxy is shutting down, no
// endpoint is at fault.
var ErrLoopStopped = errors.New("relay: loop stopped")

// balanceSlack is how many more connections than the lightest loop a loop
// holding held may keep: 1, and one more per 16 held, so that the small
// ups and downs of short connections do not bounce clients to and fro.
func balanceSlack(held int32) int32 { return 1 + held/16 }

// place starts the client fd, which l accepted, on l or on a lighter loop.
func (l *Loop) place(g *Group, fd int, h Handler) {
	if to := g.lighter(l); to != nil {
		to.held.Add(1) // counted at once: the next client sees it
		if to.post(loopCmd{op: cmdAdopt, fd: fd, h: h}) {
			return
		}
		to.held.Add(-1)
	}
	l.start(fd, h)
}

// lighter is the loop holding the fewest connections, if l holds more than
// balanceSlack beyond it; else nil (l keeps the client).
func (g *Group) lighter(l *Loop) *Loop {
	if len(g.loops) < 2 {
		return nil
	}
	mine := l.held.Load()
	least := mine - balanceSlack(mine)
	var to *Loop
	for _, o := range g.loops {
		if n := o.held.Load(); n < least {
			to, least = o, n
		}
	}
	return to
}
