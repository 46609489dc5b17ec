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
}

// errWaitedOut: the wait reached its end (and it is cleared).
var errWaitedOut = errors.New("faults: waited out")

func (w *socketWait) init(c *net.TCPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	w.conn, w.raw = c, raw
	return nil
}

// wait waits until until, which the caller has set as the socket's write
// deadline. errWaitedOut: it passed, and the deadline is cleared for the
// writes that follow. Otherwise why it ended early: ECONNRESET (the peer
// reset the socket), net.ErrClosed, or os.ErrDeadlineExceeded (someone
// else's deadline).
//
// Parked by rawio.TCPClosed: only a reset, which leaves the socket closed,
// ends the wait early; the peer's data or FIN do not, and a reset before
// the wait (right after accept, or while the writer wrote) is seen too.
func (w *socketWait) wait(until time.Time) error {
	err := w.raw.Write(rawio.TCPClosed)
	switch {
	case err == nil: // TCPClosed ends the wait only on a reset
		return syscall.ECONNRESET
	case errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(until):
		if err := w.conn.SetWriteDeadline(time.Time{}); err != nil {
			return err
		}
		return errWaitedOut
	}
	return err
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
