package relay

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// uploadMetByReset plays an upload a backend answers early and will not
// read (an HTTP server's early 413 or 401): the client writes without end,
// the backend reads 1 KiB, lets more wait unread, writes answer (none if
// nil) and closes, so its host sends a reset. It returns what the client
// read before its read ended, that read's error, and the error that
// stopped the upload.
func uploadMetByReset(t *testing.T, client, backend *net.TCPConn, answer []byte) (got []byte, readErr, writeErr error) {
	t.Helper()
	wrote := flood(client)
	if _, err := io.ReadFull(backend, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // more of the upload waits unread
	if answer != nil {
		if _, err := backend.Write(answer); err != nil {
			t.Fatal(err)
		}
	}
	backend.Close() // unread bytes: the backend's host sends a reset
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, readErr = io.ReadAll(client)
	return got, readErr, <-wrote
}

// resetSeen tells whether the client met the reset: it reaches whichever
// of its reader and writer asks first (the socket's error is taken once).
func resetSeen(readErr, writeErr error) bool {
	return errors.Is(readErr, syscall.ECONNRESET) || errors.Is(writeErr, syscall.ECONNRESET)
}

// answerQueuedAtReset is uploadMetByReset with an answer longer than the
// client's receive buffer and a client that reads it late: the backend's
// kernel sent the whole answer (the proxy's socket acknowledged it all)
// before the backend closed, so the rest of it waits in the proxy, queued
// to the client, when the reset comes. The client reads only once the
// reset reached it (its upload failed) or 100 ms passed, well within the
// relay's salvageBound.
func answerQueuedAtReset(t *testing.T, client, backend *net.TCPConn, answer []byte) (got []byte, readErr, writeErr error) {
	t.Helper()
	wrote := answerSentThenReset(t, client, backend, answer)
	select {
	case writeErr = <-wrote:
		wrote = nil
	case <-time.After(100 * time.Millisecond):
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, readErr = io.ReadAll(client)
	if wrote != nil {
		writeErr = <-wrote
	}
	return got, readErr, writeErr
}

// answerSentThenReset starts the client's upload, has the backend answer
// it with answer, waits until the backend's kernel sent all of it (its
// send queue is empty: the proxy acknowledged it), and closes the backend
// with the upload unread (a reset). It returns the upload's end.
func answerSentThenReset(t *testing.T, client, backend *net.TCPConn, answer []byte) <-chan error {
	t.Helper()
	wrote := flood(client)
	if _, err := io.ReadFull(backend, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // more of the upload waits unread
	if _, err := backend.Write(answer); err != nil {
		t.Fatal(err)
	}
	// Sent, all of it: nothing the backend's own kernel could drop.
	raw, err := backend.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		queued := -1
		_ = raw.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
		if queued == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy took %d bytes of the %d-byte answer in 5 s", len(answer)-queued, len(answer))
		}
	}
	backend.Close() // unread bytes: the backend's host sends a reset
	return wrote
}

// wantResetAfterAnswerPart reads what the client got of answer (part of
// it: it read nothing while the relay held the rest) and wants the read
// or the upload to end with a reset.
func wantResetAfterAnswerPart(t *testing.T, client *net.TCPConn, wrote <-chan error, answer []byte) {
	t.Helper()
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(client)
	if !bytes.HasPrefix(answer, got) {
		t.Errorf("client read %d bytes, not the answer's start", len(got))
	}
	if werr := <-wrote; !resetSeen(err, werr) {
		t.Errorf("client read %v, wrote %v; want a reset", err, werr)
	}
}

// A client that resets while its upload waits on a backend that reads
// nothing is passed on to the backend as a reset within about a second,
// as on the event loop (TestLoopResetBehindAStalledUploadIsPassedOn), not
// when the write bound runs out: the direction's goroutine waits on the
// backend's writability, and nobody read the client, so its reset waited
// that long (with no bound, for ever), holding both sockets, their
// buffers, a pipe and the backend's connection. Both write paths (splice
// and buffered), with the write bound and without one, and the download's
// twin: a backend that resets while its answer waits on a client that
// reads nothing.
func TestTCPResetBehindAStalledUploadIsPassedOn(t *testing.T) {
	for _, tc := range []struct {
		name     string
		buffered bool
		bound    time.Duration
		download bool
	}{
		{"splice", false, time.Minute, false},
		{"buffered", true, time.Minute, false},
		{"unbounded", false, 0, false},
		{"download", false, time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.buffered {
				old := forceBuffered
				forceBuffered = true
				t.Cleanup(func() { forceBuffered = old })
			}
			client, proxyClient := pair(t)
			proxyBackend, backend := pair(t)
			done := make(chan struct{})
			go func() {
				TCP(proxyClient, proxyBackend, Options{WriteTimeout: tc.bound})
				close(done)
			}()
			if tc.download {
				flood(backend)
				resetBehindStall(t, backend, client, unsentOf(t, proxyClient))
			} else {
				flood(client)
				resetBehindStall(t, client, backend, unsentOf(t, proxyBackend))
			}
			waitDone(t, done, 5*time.Second, "a relay whose peer reset behind a stalled direction")
		})
	}
}

// resetBehindStall waits until what from sends no longer reaches to (the
// proxy's socket towards to is full, its unsent bytes counted by unsent;
// to reads nothing), resets from, and wants to's connection reset within
// 5 s. Both data paths' tests use it.
func resetBehindStall(t *testing.T, from, to *net.TCPConn, unsent func() int) {
	t.Helper()
	raw, err := to.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	delivered := func() int {
		var queued int
		_ = raw.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		return queued + unsent()
	}
	deadline := time.Now().Add(10 * time.Second)
	for last := -1; ; {
		time.Sleep(50 * time.Millisecond)
		n := delivered()
		if n > 0 && n == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the upload never stalled")
		}
		last = n
	}
	_ = from.SetLinger(0)
	from.Close()
	reset := time.Now()
	state := func() (s int) {
		_ = raw.Control(func(fd uintptr) { s = rawio.TCPState(int(fd)) })
		return s
	}
	for state() != rawio.TCPClose {
		if time.Since(reset) > 5*time.Second {
			t.Fatalf("the other peer's connection still in TCP state %d, not reset, 5 s after its peer reset behind a stalled direction", state())
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("reset passed on in %v", time.Since(reset).Round(time.Millisecond))
}

// unsentOf counts what the proxy's socket c holds unsent (SIOCOUTQ).
func unsentOf(t *testing.T, c *net.TCPConn) func() int {
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return func() (n int) {
		_ = raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
		return n
	}
}
