package faults

import (
	"errors"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// socketWait waits out a toxic's delay parked on a socket's write side in
// the runtime's poller, the socket's write deadline its end, rather than
// on a timer: so whatever ends the connection ends the wait. A close of
// the socket (by the relay's other direction, the API's cut or the
// relay's end), a deadline the relay sets on it (its bounds) and its
// peer's reset all do. A timer woke for none of them: a dead connection
// kept its goroutines, buffers and --fault-max-active slot for the whole
// delay (an hour's latency: an hour). Only the socket's writer may wait
// on it, and it must not write while waiting.
type socketWait struct {
	conn *net.TCPConn
	raw  syscall.RawConn
	// fn is check as a value made once: a method value passed to
	// RawConn.Write escapes, an allocation per wait.
	fn func(fd uintptr) bool
}

// errWaitedOut: the wait reached its end (and it is cleared).
var errWaitedOut = errors.New("faults: waited out")

func (w *socketWait) init(c *net.TCPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	w.conn, w.raw, w.fn = c, raw, w.check
	return nil
}

// wait waits until until, which the caller has set as the socket's write
// deadline. errWaitedOut: it passed, and the deadline is cleared for the
// writes that follow. Otherwise why it ended early: ECONNRESET (the peer
// reset the socket), net.ErrClosed, or os.ErrDeadlineExceeded (someone
// else's deadline).
func (w *socketWait) wait(until time.Time) error {
	err := w.raw.Write(w.fn)
	switch {
	case err == nil: // check ends the wait only on a reset
		return syscall.ECONNRESET
	case errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(until):
		if err := w.conn.SetWriteDeadline(time.Time{}); err != nil {
			return err
		}
		return errWaitedOut
	}
	return err
}

// check keeps the wait parked. The poller calls it first, then on every
// event on the socket (the peer's data or FIN wake a writer as well as a
// reader); only a reset, which leaves the socket closed, ends the wait.
// The first call looks too: an event the socket had before the wait (a
// reset right after accept, or while the writer wrote) is not signalled
// again.
func (w *socketWait) check(fd uintptr) bool {
	return rawio.TCPState(int(fd)) == rawio.TCPClose
}

// WaitConnectDelay waits out ConnectDelay before the first dial, parked
// on the client's socket (socketWait): false when the client reset or
// the socket was closed meanwhile, so there is nothing to dial for (the
// caller closes the client and calls Done). A client that only sent data
// or half-closed is still waited for and served. A sleep dialled a
// backend for a client that had reset long before, and held the
// connection's slot and goroutine for the whole delay.
func (c *Conn) WaitConnectDelay(client *net.TCPConn) bool {
	if c.ConnectDelay <= 0 {
		return true
	}
	until := time.Now().Add(c.ConnectDelay)
	if client.SetWriteDeadline(until) != nil {
		return false
	}
	var w socketWait
	if w.init(client) != nil {
		return false
	}
	return errors.Is(w.wait(until), errWaitedOut)
}
