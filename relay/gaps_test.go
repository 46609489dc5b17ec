package relay

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// peerGaps times a test peer's steady activity (a writer's writes, a slow
// reader's reads) against a bound on inactivity: the longest time from
// the start of one step to the end of the next, and from the last step's
// start to now, bounds how long the relay can have seen that peer idle
// (the kernel's receive and send times of its bytes fall inside the
// steps). A loaded machine stretches a test's 100 ms pauses past a few
// hundred ms bound now and then, and then a cut is right.
type peerGaps struct {
	lastStart time.Time
	longest   time.Duration
}

// step records one step (a write, a read) that ran from start to now.
func (g *peerGaps) step(start time.Time) {
	if !g.lastStart.IsZero() {
		g.longest = max(g.longest, time.Since(g.lastStart))
	}
	g.lastStart = start
}

// through is the longest gap, counting the one from the last step's start
// to now.
func (g *peerGaps) through() time.Duration {
	if g.lastStart.IsZero() {
		return g.longest
	}
	return max(g.longest, time.Since(g.lastStart))
}

// cutWhileActive fails the test for a cut (err) of a connection whose
// peer (who) kept it active, unless that peer was held idle for the bound
// or longer: then the cut was right, and there is no verdict.
func cutWhileActive(t *testing.T, g interface{ through() time.Duration }, bound time.Duration, who string, err error) {
	t.Helper()
	if gap := g.through(); gap >= bound {
		t.Skipf("no verdict: the machine held the %s idle for %v, past the %v bound, so the cut (%v) was right",
			who, gap.Round(time.Millisecond), bound, err)
	}
	t.Fatalf("cut while the %s was active (its longest gap %v, the bound %v): %v",
		who, g.through().Round(time.Millisecond), bound, err)
}

// recvGaps times the bytes a slow reader's socket receives, by its
// kernel's clock (TCP_INFO's last_data_recv): on loopback, the instants
// the proxy's kernel sent them on, which is the activity the half-close
// bound counts for a reader. The reader's own reads are no measure of
// it: a receive buffer holding a few reads is refilled in one burst once
// its window reopens, so under load the sends come several slowed reads
// apart (a reader whose longest gap between reads was 426 ms was cut by
// a 1 s bound, and rightly: its kernel had received nothing for 1 s).
type recvGaps struct {
	conn    *net.TCPConn
	last    time.Time // the last receive seen
	longest time.Duration
}

// look records the socket's last receive.
func (g *recvGaps) look() {
	raw, err := g.conn.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return
		}
		at := time.Now().Add(-time.Duration(info.Last_data_recv) * time.Millisecond)
		// The kernel counts in ticks: a few ms either way is one receive.
		if g.last.IsZero() || at.Sub(g.last) > 10*time.Millisecond {
			if !g.last.IsZero() {
				g.longest = max(g.longest, at.Sub(g.last))
			}
			g.last = at
		}
	})
}

// through is the longest time the socket received nothing, counting from
// its last receive to now, with a tick of slack for the kernel's clock.
func (g *recvGaps) through() time.Duration {
	if g.last.IsZero() {
		return g.longest
	}
	return max(g.longest, time.Since(g.last)) + 10*time.Millisecond
}
