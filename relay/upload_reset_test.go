package relay

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
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
