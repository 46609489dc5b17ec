package relay

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Counter receives the bytes a direction moved (a prometheus.Counter fits).
type Counter interface{ Add(float64) }

// Copier moves one direction's bytes from src to dst until src ends. It
// returns nil when src sent a FIN (TCP then half-closes dst), or an error:
// a *WriteError for a failure on dst, ErrReset or ErrCut for an end the
// copier chose (a fault), anything else for a failure reading src. A
// Copier must not close either connection; TCP does.
type Copier func(dst, src *net.TCPConn) (int64, error)

// ErrReset asks TCP to abort both connections with a reset (SO_LINGER 0).
var ErrReset = errors.New("relay: reset requested")

// ErrCut asks TCP to close both connections with a FIN, as a peer that
// hung up would.
var ErrCut = errors.New("relay: cut requested")

// WriteError marks a failure on the destination side, so the peer that
// did not fail is the one reset.
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return "write: " + e.Err.Error() }
func (e *WriteError) Unwrap() error { return e.Err }

// Options are one connection's settings. The zero value copies both ways
// with Auto (small messages buffered, bulk spliced), no half-close bound,
// and counts nothing.
type Options struct {
	// HalfCloseTimeout bounds the direction still running after the other
	// ended with a FIN; 0 = no bound.
	HalfCloseTimeout time.Duration
	// In counts client→backend bytes, Out backend→client; nil = not counted.
	In, Out Counter
	// Upstream moves client→backend, Downstream backend→client; nil = Auto.
	Upstream, Downstream Copier
}

// TCP relays client↔backend until both directions are done, then closes
// both. A FIN is passed on as a half-close; the other direction then has
// HalfCloseTimeout to finish, so a peer that never closes cannot pin the
// goroutines forever (the legacy leak, kubernetes#18354). A reset on one
// side resets the other.
func TCP(client, backend *net.TCPConn, o Options) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		copyHalf(backend, client, o.Upstream, o.HalfCloseTimeout, o.In)
	}()
	copyHalf(client, backend, o.Downstream, o.HalfCloseTimeout, o.Out)
	wg.Wait()
	client.Close()
	backend.Close()
}

// copyHalf is a named function so goroutine dumps say what a stuck
// goroutine was doing.
func copyHalf(dst, src *net.TCPConn, copier Copier, halfCloseTimeout time.Duration, bytes Counter) {
	if copier == nil {
		copier = Auto
	}
	n, err := copier(dst, src)
	if bytes != nil {
		bytes.Add(float64(n))
	}
	if err != nil {
		switch {
		case errors.Is(err, ErrReset), errors.Is(err, os.ErrDeadlineExceeded):
			// A fault's reset, or the half-close bound ran out with the
			// stream unfinished: neither peer may mistake the end for a
			// complete stream, so both get a reset, never a FIN.
			_ = dst.SetLinger(0)
			_ = src.SetLinger(0)
		case isReset(err):
			// Pass the reset on to the side that did not send it.
			var we *WriteError
			if errors.As(err, &we) {
				_ = src.SetLinger(0)
			} else {
				_ = dst.SetLinger(0)
			}
		}
		// Either side failed: tear both down so the other copy returns too.
		dst.Close()
		src.Close()
		return
	}
	_ = dst.CloseWrite()
	if halfCloseTimeout > 0 {
		watchHalfClosed(dst, halfCloseTimeout)
	}
}

// watchHalfClosed bounds the direction still reading from conn after the
// other one ended: it ends (with a reset) only once conn has received
// nothing for a whole timeout, so a stream still flowing is never cut
// (a fixed deadline cut a backend streaming for longer than the bound).
// Progress is the kernel's byte count (TCP_INFO), so the copy loop pays
// nothing per byte; a peer that stops reading stalls that count too, so a
// stuck writer is bounded as well.
func watchHalfClosed(conn *net.TCPConn, timeout time.Duration) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return
	}
	received := func() (uint64, bool) {
		var n uint64
		var ok bool
		_ = raw.Control(func(fd uintptr) {
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				n, ok = info.Bytes_received, true
			}
		})
		return n, ok
	}
	last, ok := received()
	if !ok {
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
		return
	}
	// A timer, not a goroutine: a connection that ends meanwhile costs one
	// more wake-up, which finds the socket closed.
	var t *time.Timer
	fire := func() {
		now, ok := received()
		if !ok {
			return // closed: the relay is done
		}
		if now == last {
			// A past deadline wakes the blocked read with
			// os.ErrDeadlineExceeded; copyHalf resets both peers.
			_ = conn.SetReadDeadline(time.Unix(1, 0))
			return
		}
		last = now
		t.Reset(timeout)
	}
	// Armed only once t is set, so fire never sees it unset.
	t = time.AfterFunc(time.Duration(1<<62), fire)
	t.Reset(timeout)
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
