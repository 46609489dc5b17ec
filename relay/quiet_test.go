package relay

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestQuietFor(t *testing.T) {
	const need = time.Second
	for _, tc := range []struct {
		name            string
		client, backend sockQuiet
		quiet           bool
		wait            time.Duration
	}{
		{"both silent long enough", sockQuiet{sinceRecv: 3 * time.Second}, sockQuiet{sinceRecv: time.Second}, true, 0},
		{"client spoke 200ms ago", sockQuiet{sinceRecv: 200 * time.Millisecond}, sockQuiet{sinceRecv: time.Hour}, false, 800 * time.Millisecond},
		{"backend answered 900ms ago", sockQuiet{sinceRecv: time.Hour}, sockQuiet{sinceRecv: 900 * time.Millisecond}, false, 100 * time.Millisecond},
		{"answer still in flight to the client", sockQuiet{sinceRecv: time.Hour, queued: true}, sockQuiet{sinceRecv: time.Hour}, false, 250 * time.Millisecond},
		{"request still in flight to the backend", sockQuiet{sinceRecv: time.Hour}, sockQuiet{sinceRecv: time.Hour, queued: true}, false, 250 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			quiet, wait := quietFor(tc.client, tc.backend, need)
			if quiet != tc.quiet || wait != tc.wait {
				t.Errorf("quietFor = %v, %v; want %v, %v", quiet, wait, tc.quiet, tc.wait)
			}
		})
	}
}

// scripted is a connection whose sockets say what the test sets, for
// quietCloser on a fake clock.
type scripted struct {
	sinceRecv atomic.Int64 // nanoseconds, both sockets
	gone      atomic.Bool
	checks    chan struct{}
	closed    chan struct{}
}

func newScripted() *scripted {
	return &scripted{checks: make(chan struct{}, 16), closed: make(chan struct{}, 16)}
}

func (s *scripted) state() (sockQuiet, sockQuiet, bool) {
	defer func() { s.checks <- struct{}{} }()
	q := sockQuiet{sinceRecv: time.Duration(s.sinceRecv.Load())}
	return q, q, !s.gone.Load()
}

// asyncClock runs AfterFunc callbacks in a goroutine of their own, as the
// real clock does; the fake one calls them inside Step, under its lock.
type asyncClock struct{ *clocktesting.FakeClock }

func (c asyncClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return c.FakeClock.AfterFunc(d, func() { go f() })
}

func (s *scripted) closer(clk *clocktesting.FakeClock) *quietCloser {
	return &quietCloser{clk: asyncClock{clk}, quiet: time.Second, state: s.state, close: func(bool) { s.closed <- struct{}{} }}
}

// step advances the fake clock and waits for the check it fires.
func step(t *testing.T, clk *clocktesting.FakeClock, s *scripted, d time.Duration) {
	t.Helper()
	clk.Step(d)
	select {
	case <-s.checks:
	case <-time.After(5 * time.Second):
		t.Fatalf("no check %v later", d)
	}
}

func wantClosed(t *testing.T, s *scripted, want bool) {
	t.Helper()
	select {
	case <-s.closed:
		if !want {
			t.Fatal("closed, want still open")
		}
	case <-time.After(50 * time.Millisecond):
		if want {
			t.Fatal("still open, want closed")
		}
	}
}

// A connection past its due time is closed only once it has been quiet
// for the quiet time; busy, it is looked at again when it could be.
func TestQuietCloserWaitsForQuiet(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s := newScripted()
	q := s.closer(clk)
	q.closeAt(clk.Now().Add(5 * time.Minute))
	if clk.HasWaiters() != true {
		t.Fatal("no timer armed for the due time")
	}
	s.sinceRecv.Store(int64(200 * time.Millisecond)) // a request just went by
	step(t, clk, s, 5*time.Minute)
	wantClosed(t, s, false)
	// Looked at again when the last byte is a quiet time old: 800 ms.
	clk.Step(799 * time.Millisecond)
	select {
	case <-s.checks:
		t.Fatal("checked before the quiet time could have passed")
	case <-time.After(50 * time.Millisecond):
	}
	s.sinceRecv.Store(int64(time.Second))
	step(t, clk, s, time.Millisecond)
	wantClosed(t, s, true)
	if clk.HasWaiters() {
		t.Error("a timer is still armed after the close")
	}
}

// The earliest request wins: a later one changes nothing, an earlier one
// moves the due time.
func TestQuietCloserEarliestRequestWins(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s := newScripted()
	s.sinceRecv.Store(int64(time.Hour))
	q := s.closer(clk)
	q.closeAt(clk.Now().Add(5 * time.Minute))  // max age
	q.closeAt(clk.Now().Add(10 * time.Minute)) // later: ignored
	q.closeAt(clk.Now().Add(30 * time.Second)) // drain: earlier
	step(t, clk, s, 30*time.Second)
	wantClosed(t, s, true)
}

// A connection that ended on its own is not closed again, and stop
// disarms the timer.
func TestQuietCloserGoneAndStopped(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s := newScripted()
	s.gone.Store(true)
	q := s.closer(clk)
	q.closeAt(clk.Now().Add(time.Minute))
	step(t, clk, s, time.Minute)
	wantClosed(t, s, false)

	s2 := newScripted()
	q2 := s2.closer(clk)
	q2.closeAt(clk.Now().Add(time.Minute))
	q2.stop()
	clk.Step(time.Hour)
	wantClosed(t, s2, false)
}

// relayedConn is relayed with the Conn, to ask it to close.
func relayedConn(t *testing.T, o Options) (client, backend *net.TCPConn, c *Conn, done chan struct{}) {
	client, proxyClient := pair(t)
	proxyBackend, backend := pair(t)
	c = New(proxyClient, proxyBackend, o)
	done = make(chan struct{})
	go func() {
		c.Run()
		close(done)
	}()
	return client, backend, c, done
}

// On real sockets: a connection asked to close while a request/response
// exchange runs every 100 ms stays up (it is never quiet for 300 ms);
// once the client goes idle it gets a FIN, not a reset, and the backend
// gets its FIN after the client closed.
func TestCloseWhenQuietFINsAtIdle(t *testing.T) {
	client, backend, c, done := relayedConn(t, Options{Quiet: 300 * time.Millisecond})
	go func() { // the backend echoes until the client's FIN arrives
		_, _ = io.Copy(backend, backend)
		backend.CloseWrite()
	}()
	c.CloseWhenQuiet(0)
	buf := make([]byte, 5)
	busyUntil := time.Now().Add(time.Second)
	exchanges := 0
	var idle time.Time // the last byte's arrival
	for time.Now().Before(busyUntil) {
		if _, err := client.Write([]byte("ping\n")); err != nil {
			t.Fatalf("write after %d exchanges: %v", exchanges, err)
		}
		_ = client.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(client, buf); err != nil {
			// The premise is exchanges 100 ms apart, never 300 ms quiet;
			// a machine that held this goroutine past that made it quiet
			// (seen once at load 20 on 2 cores): no verdict then.
			if exchanges > 0 && time.Since(idle) >= 300*time.Millisecond {
				t.Skipf("exchange %d cut after %v without one (the machine stalled the test past the quiet time): %v", exchanges, time.Since(idle), err)
			}
			t.Fatalf("exchange %d cut while busy: %v", exchanges, err)
		}
		exchanges++
		idle = time.Now()
		time.Sleep(100 * time.Millisecond)
	}
	_ = client.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, err := client.Read(buf)
	if n != 0 || err != io.EOF {
		t.Fatalf("idle client read %d bytes, %v; want a FIN (EOF)", n, err)
	}
	took := time.Since(idle)
	t.Logf("%d exchanges over 1 s kept it up; FIN %v after the client went idle", exchanges, took.Round(time.Millisecond))
	if took < 250*time.Millisecond {
		t.Errorf("FIN after %v idle, before the 300 ms quiet time", took)
	}
	client.Close()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("relay still running after the client closed")
	}
	_ = backend.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := backend.Read(buf); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		t.Errorf("backend ended with %v, want a FIN", err)
	}
}

// A connection that is never quiet is closed anyway once the deadline
// passed since its due time: checked as often as it could be quiet, then
// at the deadline itself.
func TestQuietCloserDeadlineClosesBusy(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s := newScripted()
	var forced atomic.Bool
	q := s.closer(clk)
	q.deadline = time.Second
	q.close = func(f bool) { forced.Store(f); s.closed <- struct{}{} }
	s.sinceRecv.Store(int64(100 * time.Millisecond)) // a request every 100 ms
	q.closeAt(clk.Now().Add(time.Minute))
	step(t, clk, s, time.Minute)
	wantClosed(t, s, false)
	step(t, clk, s, 900*time.Millisecond) // as if a quiet second could have passed
	wantClosed(t, s, false)
	step(t, clk, s, 100*time.Millisecond) // the deadline
	wantClosed(t, s, true)
	if !forced.Load() {
		t.Error("closed at the deadline as if quiet")
	}
	if clk.HasWaiters() {
		t.Error("a timer is still armed after the close")
	}
}

// busyUntilClosed exchanges a ping with the echoing backend every 100 ms
// from ask on, until the connection ends; it returns how long after ask
// that was, and the longest time between two of its writes (or its last
// write and the end): the longest the connection can have been quiet, which
// a loaded machine stretches past a test's quiet time. The end must be one
// a client sees from a closing server (a FIN, or a reset for a request sent
// after the close), never a stall.
func busyUntilClosed(t *testing.T, client, backend *net.TCPConn, ask func()) (took, longestGap time.Duration) {
	t.Helper()
	go func() { // the backend echoes until the client's end
		_, _ = io.Copy(backend, backend)
		_ = backend.CloseWrite()
	}()
	buf := make([]byte, 5)
	asked := time.Now()
	ask()
	exchanges := 0
	lastWrite := asked
	for time.Since(asked) < 3*time.Second {
		_ = client.SetDeadline(time.Now().Add(2 * time.Second))
		now := time.Now()
		longestGap, lastWrite = max(longestGap, now.Sub(lastWrite)), now
		_, err := client.Write([]byte("ping\n"))
		if err == nil {
			_, err = io.ReadFull(client, buf)
		}
		if err != nil {
			took := time.Since(asked)
			longestGap = max(longestGap, time.Since(lastWrite))
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isReset(err) {
				t.Fatalf("exchange %d ended with %v, want a FIN or a reset", exchanges, err)
			}
			t.Logf("closed %v after the request, %d exchanges later (%v); longest gap between writes %v",
				took.Round(time.Millisecond), exchanges, err, longestGap.Round(time.Millisecond))
			client.Close() // as the client's pool does
			return took, longestGap
		}
		exchanges++
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("still open 3 s after the close was asked, %d exchanges later: a busy connection is never closed", exchanges)
	return 0, 0
}

// wantClosedAtDeadline: a connection kept busy is closed at the deadline,
// not as quiet, unless the test's writer was held for the quiet time (a
// loaded machine), when a quiet close is right. Judged by the time of the
// close it was wrong both ways: a quiet close after a stall late in the
// second failed it (CI at load 20: "QuietEnd = 1 after 1.16s").
func wantClosedAtDeadline(t *testing.T, got QuietEnd, took, longestGap, quiet time.Duration) {
	t.Helper()
	if got == ClosedAtDeadline || got == ClosedQuiet && longestGap >= quiet {
		return
	}
	t.Errorf("QuietEnd = %d after %v with writes at most %v apart (quiet time %v), want ClosedAtDeadline",
		got, took.Round(time.Millisecond), longestGap.Round(time.Millisecond), quiet)
}

// An exchange every 100 ms keeps a connection from ever being quiet for
// 300 ms: with a 1 s deadline it is closed about 1 s after the close came
// due all the same (a pooled keep-alive connection with a request always
// going was never closed, so max age and drain did nothing for it).
func TestCloseWhenQuietDeadlineClosesBusy(t *testing.T) {
	client, backend, c, done := relayedConn(t, Options{Quiet: 300 * time.Millisecond, CloseDeadline: time.Second})
	took, longestGap := busyUntilClosed(t, client, backend, func() { c.CloseWhenQuiet(0) })
	if took > 1600*time.Millisecond {
		t.Errorf("closed %v after the request, want about the 1 s deadline", took.Round(time.Millisecond))
	}
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("relay still running after the forced close")
	}
	wantClosedAtDeadline(t, c.QuietEnd(), took, longestGap, 300*time.Millisecond)
}
