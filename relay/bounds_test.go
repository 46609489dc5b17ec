package relay

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// flood writes to c until a write fails, and reports that error.
func flood(c *net.TCPConn) <-chan error {
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				errc <- err
				return
			}
		}
	}()
	return errc
}

// wantResetRead reads c until an error and wants a reset, not an EOF.
func wantResetRead(t *testing.T, name string, c *net.TCPConn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, c)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("%s read ended with %v; want ECONNRESET (a reset, never a FIN)", name, err)
	}
}

func wantResetWrite(t *testing.T, name string, errc <-chan error) {
	t.Helper()
	select {
	case err := <-errc:
		if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Errorf("%s write ended with %v; want ECONNRESET or EPIPE", name, err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("%s still writing 5 s after the relay ended", name)
	}
}

func waitDone(t *testing.T, done <-chan struct{}, within time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-done:
	case <-time.After(within):
		t.Fatalf("relay still running %v after %s", within, what)
	}
	return time.Since(start)
}

// A client that never reads stalls the backend→client copy in its write;
// with a write bound the relay ends within it, and both peers get a reset.
// Before the bound the relay stayed blocked for as long as the client lived.
func TestWriteTimeoutResetsBothPeers(t *testing.T) {
	for _, path := range []string{"splice", "buffered"} {
		t.Run(path, func(t *testing.T) {
			o := Options{WriteTimeout: 300 * time.Millisecond}
			client, backend, done := relayedBuffered(t, o, path == "buffered")
			_ = client.SetReadBuffer(4096)
			errc := flood(backend)
			took := waitDone(t, done, 5*time.Second, "the client stopped reading with a 300 ms write bound")
			t.Logf("relay ended %v after the flood began", took.Round(time.Millisecond))
			wantResetWrite(t, "backend", errc)
			wantResetRead(t, "client", client)
		})
	}
}

// relayedBuffered is relayed, optionally with the buffered copy built in
// (the bound's other path) instead of splice.
func relayedBuffered(t *testing.T, o Options, buffered bool) (client, backend *net.TCPConn, done chan struct{}) {
	if buffered {
		old := forceBuffered
		forceBuffered = true
		t.Cleanup(func() { forceBuffered = old })
	}
	return relayed(t, o)
}

// A reader that is slow but steady keeps the write bound from firing: the
// bound is on time without progress, not on the time a chunk takes. The
// whole read takes 2.4 s, over twice the 1 s bound; the bound is ten of
// the reader's 100 ms pauses, since on a loaded machine (load 10-16) a
// pause overran a 300 ms bound.
func TestWriteTimeoutSpareSlowReader(t *testing.T) {
	client, backend, done := relayed(t, Options{WriteTimeout: time.Second})
	// 1 MiB every 100 ms: the copy waits up to 100 ms at a time, a tenth
	// of the bound, for seconds.
	readSlowly(t, client, backend, 24<<20, 1<<20, 100*time.Millisecond)
	client.Close()
	<-done
}

// readSlowly has backend send total bytes and its FIN, lets every buffer
// between them fill, then reads client to its end chunk bytes at a time
// with pause after each: a reader slow but steady, which a write bound on
// time without progress must spare. It fails t unless the client gets
// every byte and the end, and returns how long the reading took.
func readSlowly(t *testing.T, client, backend *net.TCPConn, total, chunk int, pause time.Duration) time.Duration {
	t.Helper()
	go func() {
		_, _ = backend.Write(make([]byte, total))
		_ = backend.CloseWrite()
	}()
	time.Sleep(150 * time.Millisecond) // every buffer fills
	buf := make([]byte, chunk)
	got := 0
	start := time.Now()
	_ = client.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		n, err := io.ReadFull(client, buf)
		got += n
		if err != nil {
			if err != io.EOF && err != io.ErrUnexpectedEOF {
				t.Fatalf("client read after %d bytes (%v): %v", got, time.Since(start), err)
			}
			break
		}
		time.Sleep(pause)
	}
	if got != total {
		t.Fatalf("client got %d bytes, want %d", got, total)
	}
	return time.Since(start)
}

// A half-closed connection whose remaining direction is stuck writing to a
// client that never reads ends at the half-close bound: the bound used to
// set only a read deadline, which never woke the blocked writer (the relay
// stayed up 3 s past a 300 ms bound, and forever without a write bound).
func TestHalfCloseTimeoutWakesStuckWriter(t *testing.T) {
	client, backend, done := relayed(t, Options{HalfCloseTimeout: 300 * time.Millisecond})
	_ = client.SetReadBuffer(4096)
	client.CloseWrite()
	errc := flood(backend)
	took := waitDone(t, done, 3*time.Second, "a 300 ms half-close bound with a stuck writer")
	t.Logf("relay ended %v after the half-close", took.Round(time.Millisecond))
	wantResetWrite(t, "backend", errc)
	wantResetRead(t, "client", client)
}

// An abnormal end of one socket (a dead peer found by keep-alive or the
// user timeout: ETIMEDOUT; an unreachable host) reaches the other peer as
// a reset: it used to get a FIN and could take a truncated stream for a
// complete one.
func TestAbnormalEndResetsOtherPeer(t *testing.T) {
	for _, e := range []error{syscall.ETIMEDOUT, syscall.EHOSTUNREACH, errors.New("local failure")} {
		t.Run(e.Error(), func(t *testing.T) {
			fail := func(dst, src *net.TCPConn) (int64, error) { return 0, e }
			client, backend, done := relayed(t, Options{Upstream: fail})
			<-done
			wantResetRead(t, "client", client)
			wantResetRead(t, "backend", backend)
		})
	}
}

// finThenResets are peers that half-close and then abort (SO_LINGER 0):
// nothing the relay still runs reads or writes their socket again, and
// the other peer neither reads nor writes.
var finThenResets = []struct {
	name    string
	data    bool          // bytes before the FIN
	wait    time.Duration // between the FIN and the reset
	seenFIN bool          // the other peer read the FIN before the reset
}{
	{"FIN passed on, then reset", false, 0, true},
	{"bytes, FIN passed on, then reset", true, 0, true},
	{"FIN, 1 ms, reset", false, time.Millisecond, false},
	{"FIN, 200 ms, reset", false, 200 * time.Millisecond, false},
}

// finThenReset has from half-close and then reset, and wants to learn of
// the reset promptly (the half-close bound is far off): the relay used to
// leave both sockets, and to's peer in CLOSE_WAIT, for the whole bound.
func finThenReset(t *testing.T, from, to *net.TCPConn, data bool, wait time.Duration, seenFIN bool) {
	t.Helper()
	if data {
		if _, err := from.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
	}
	_ = from.CloseWrite()
	if seenFIN {
		_ = to.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(to); err != nil {
			t.Fatalf("the FIN did not come through: %v", err)
		}
	}
	time.Sleep(wait)
	_ = from.SetLinger(0)
	from.Close()
	wantResetAfterFIN(t, to, 2*time.Second)
}

// wantResetAfterFIN wants c reset within d. A read that reached the FIN
// cannot say so any more (it says end of file from then on): the socket's
// state can, CLOSE with no FIN of ours sent.
func wantResetAfterFIN(t *testing.T, c *net.TCPConn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	if _, err := io.Copy(io.Discard, c); err != nil {
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read ended with %v; want a reset", err)
		}
		return
	}
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	state := -1
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		_ = raw.Control(func(fd uintptr) { state = rawio.TCPState(int(fd)) })
		if state == rawio.TCPClose {
			return
		}
	}
	t.Fatalf("no reset within %v of the peer's: TCP state %d (8: CLOSE_WAIT, the FIN alone)", d, state)
}

// endsBeforeRead are peers that send bytes and reset (after a FIN or
// not), all of it queued on the proxy's socket before the relay reads it.
// The read that takes the bytes must not be the direction's last: the
// kernel's TCP_INQ hint counts bytes and a FIN, not a reset, and the
// reset's (edge-triggered) wake-up came with the bytes'. Nor may the end
// of file a read returns ahead of a reset behind a FIN (a read gives the
// FIN before a pending error) pass for a FIN.
var endsBeforeRead = []struct {
	name string
	fin  bool
}{
	{"bytes, reset", false},
	{"bytes, FIN, reset", true},
}

// endBeforeRead has from send "request" (and a FIN, if fin) and reset,
// and waits for each to reach the proxy's socket, which onProxySide runs
// a look at: the bytes before the reset (which drops what is unsent), the
// reset (CLOSE) and its wake-up before returning.
func endBeforeRead(t *testing.T, from *net.TCPConn, fin bool, onProxySide func(look func(fd int))) {
	t.Helper()
	if _, err := from.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if fin {
		_ = from.CloseWrite()
	}
	waitProxySide(t, onProxySide, func(fd int) bool {
		n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
		return err == nil && n == len("request") && (!fin || rawio.TCPState(fd) == rawio.TCPCloseWait)
	})
	_ = from.SetLinger(0)
	from.Close()
	waitProxySide(t, onProxySide, func(fd int) bool { return rawio.TCPState(fd) == rawio.TCPClose })
	// Let the runtime's poller take the reset's event too, as it does
	// with a relay waiting (it polls when idle, and every 10 ms at least):
	// readiness the goroutine relay's next read then starts by clearing.
	time.Sleep(20 * time.Millisecond)
}

func waitProxySide(t *testing.T, onProxySide func(look func(fd int)), arrived func(fd int) bool) {
	t.Helper()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		ok := false
		onProxySide(func(fd int) { ok = arrived(fd) })
		if ok {
			return
		}
	}
	t.Fatal("the peer's bytes or reset never reached the proxy's socket")
}

// wantRequestThenReset wants c to read "request" and then a reset, not a
// FIN nor nothing, within 2 s.
func wantRequestThenReset(t *testing.T, c *net.TCPConn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	got, err := io.ReadAll(c)
	if string(got) != "request" || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read %q, then %v (nil: a FIN); want %q, then a reset", got, err, "request")
	}
}
