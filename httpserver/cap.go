package httpserver

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// capListener caps open connections at max. A client accepted at the cap
// takes the place of the connection idle the longest (a keep-alive
// connection between requests), else of the one that has been reading the
// longest without a request to serve (its headers unfinished), which is
// closed; only when every open connection is serving a request (each
// bounded by the timeouts) does it wait for one to end or go idle. Waiting
// alone (netutil.LimitListener) let 100 clients that each sent a request
// every IdleTimeout hold every slot for as long as they liked, and counting
// unfinished headers as busy let a slowloris client do the same with
// connections the header timeout cut and it opened again: kubelet's and
// load balancers' probes of /healthz and of the healthCheckNodePorts then
// hung (9.5 s under 300 such connections).
type capListener struct {
	net.Listener
	slots chan struct{} // one token per open connection
	// idled says a connection went idle (Accept may be waiting for one);
	// done is closed by Close, ending a waiting Accept.
	idled     chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	mu sync.Mutex
	// idle holds the connections between requests (http.StateIdle), in
	// the order they became idle; open holds every connection, in the
	// order they were accepted.
	idle []*cappedConn
	open []*cappedConn
}

func newCapListener(ln net.Listener, max int) *capListener {
	return &capListener{Listener: ln, slots: make(chan struct{}, max),
		idled: make(chan struct{}, 1), done: make(chan struct{})}
}

func (l *capListener) Accept() (net.Conn, error) {
accept:
	for {
		// The client first, then its slot: a slot taken ahead closed an
		// idle connection at the cap with no one waiting (the cap was one
		// less, and keep-alive clients at the cap pushed each other out in
		// turn). Waiting, this holds one accepted client beyond the cap.
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		for {
			select {
			case l.slots <- struct{}{}:
				return l.opened(c), nil
			default:
			}
			if oldest := l.oldestIdle(); oldest != nil {
				_ = oldest.Close() // gives its slot back
				continue
			}
			oldest, ripe := l.oldestReading(time.Now())
			if oldest != nil && ripe == 0 {
				_ = oldest.Close()
				continue
			}
			if silent(c) {
				// Not worth a wait: it would take a slot to read
				// nothing. The next client instead.
				_ = c.Close()
				continue accept
			}
			// Every connection is serving a request, has only just
			// come, or has a request the server has yet to read: wait
			// for one to end, to finish its request and go idle, or to
			// have read for readingGrace, and look again.
			switch l.wait(oldest != nil, ripe) {
			case waitSlot:
				return l.opened(c), nil
			case waitClosed:
				c.Close()
				return nil, net.ErrClosed
			}
		}
	}
}

// What wait saw.
const (
	waitSlot   = iota // took a slot
	waitAgain         // a connection went idle, or a reader's grace ended
	waitClosed        // the listener was closed
)

// wait blocks until a slot is free, a connection goes idle, the listener
// closes, or (reading) ripe has passed.
func (l *capListener) wait(reading bool, ripe time.Duration) int {
	var grace <-chan time.Time
	if reading {
		t := time.NewTimer(ripe)
		defer t.Stop()
		grace = t.C
	}
	select {
	case l.slots <- struct{}{}:
		return waitSlot
	case <-grace:
		return waitAgain
	case <-l.idled:
		return waitAgain
	case <-l.done:
		return waitClosed
	}
}

func (l *capListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// opened wraps c, which holds a slot, and lists it as open.
func (l *capListener) opened(c net.Conn) *cappedConn {
	cc := &cappedConn{Conn: c, l: l, accepted: time.Now()}
	l.mu.Lock()
	l.open = append(l.open, cc)
	l.mu.Unlock()
	return cc
}

// readingGrace is how long a connection may read before the cap counts
// it as reading, not about to serve: a client's request reaches its
// handler within milliseconds of its accept, and one taken for a reader
// in that window was cut with its request unanswered.
const readingGrace = 250 * time.Millisecond

// oldestReading is the open connection accepted first that is neither
// serving a request nor idle: one still reading its request (or not yet
// sent a byte), and in how long it will have read for readingGrace (0:
// it has, and the server waits on its client). Nil when there is none.
//
// Past the grace, a connection counts as waiting on its client only while
// the server is in a read of it that has nothing to read: bytes waiting
// unread, or no read under way, mean the server is behind, not the
// client (a loaded machine kept a request that had arrived whole from
// its handler for over 250 ms, and the cap cut it unanswered); it is
// looked at again a grace later.
func (l *capListener) oldestReading(now time.Time) (*cappedConn, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var behind *cappedConn
	for _, c := range l.open {
		if c.serving.Load() || c.idle {
			continue
		}
		if ripe := c.accepted.Add(readingGrace).Sub(now); ripe > 0 {
			return c, ripe
		}
		if c.waitsOnClient() {
			return c, 0
		}
		if behind == nil {
			behind = c
		}
	}
	if behind != nil {
		return behind, readingGrace
	}
	return nil, 0
}

// silent reports whether c, accepted at the cap, is a client that has sent
// nothing for readingGrace (nothing since its handshake, or since its last
// byte) and whose request head has not come whole. Without it a new client
// waited for a slot whatever it was, so clients that kept connections open
// and silent took the slots one readingGrace after another, in the
// kernel's order: at 100 slots per 250 ms a probe queued behind 4,000 of
// them waited 10 s. A client whose request came whole waits for a slot, as
// does one whose handshake or last byte is younger than the grace (on its
// way: its request follows within milliseconds).
func silent(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	quiet := false
	_ = raw.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil || time.Duration(info.Last_data_recv)*time.Millisecond < readingGrace {
			return
		}
		var head [4096]byte
		n, _, err := unix.Recvfrom(int(fd), head[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN:
			quiet = true // nothing sent
		case err != nil:
		default:
			// A head longer than the peek is not a slow client's. Its
			// blank line may follow a bare LF, and be one: net/http
			// reads lines ending in LF as in CRLF ("GET / HTTP/1.0\n\n"
			// from printf and nc was closed unanswered).
			quiet = n < len(head) && !wholeHead(head[:n])
		}
	})
	return quiet
}

// wholeHead reports whether b holds a request head's end: a blank line
// after a line's LF, the blank line CRLF or a bare LF.
func wholeHead(b []byte) bool {
	return bytes.Contains(b, []byte("\n\r\n")) || bytes.Contains(b, []byte("\n\n"))
}

// oldestIdle takes the longest-idle connection off the idle list.
func (l *capListener) oldestIdle() *cappedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.idle) == 0 {
		return nil
	}
	c := l.idle[0]
	l.idle = l.idle[1:]
	return c
}

// track is the server's ConnState hook: it keeps the idle list.
func (l *capListener) track(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*cappedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, x := range l.idle {
		if x == c {
			l.idle = append(l.idle[:i], l.idle[i+1:]...)
			break
		}
	}
	if state != http.StateActive {
		c.serving.Store(false) // idle, closed or hijacked
	}
	c.idle = state == http.StateIdle
	if c.idle {
		l.idle = append(l.idle, c)
		select {
		case l.idled <- struct{}{}:
		default:
		}
	}
}

// cappedConn gives its slot back once, at its first Close.
type cappedConn struct {
	net.Conn
	l    *capListener
	once sync.Once
	// reads counts the server's reads under way.
	reads atomic.Int32
	// serving is set from the start of a request's handler (serveCapped)
	// until the connection goes idle or closes (track).
	serving  atomic.Bool
	accepted time.Time
	idle     bool // on the idle list; guarded by l.mu
}

func (c *cappedConn) Read(b []byte) (int, error) {
	c.reads.Add(1)
	defer c.reads.Add(-1)
	return c.Conn.Read(b)
}

// waitsOnClient reports whether the server is in a read of c with nothing
// to read: no byte of the client's waits in the kernel (SIOCINQ).
func (c *cappedConn) waitsOnClient() bool {
	if c.reads.Load() == 0 {
		return false
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	unread := 0
	if raw.Control(func(fd uintptr) { unread, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }) != nil || err != nil {
		return true // closed, or not a socket: nothing to wait for
	}
	return unread == 0
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		if i := slices.Index(c.l.open, c); i >= 0 {
			c.l.open = slices.Delete(c.l.open, i, i+1)
		}
		c.l.mu.Unlock()
		<-c.l.slots
	})
	return err
}

// connKey carries a request's connection in its context (ConnContext).
type connKey struct{}

// serveCapped marks a capped connection as serving while h runs one of
// its requests: the cap closes a connection that is only reading.
//
// Reading a request's body is reading, not serving: while h waits on the
// body, the connection is a reader the cap may close, as one whose
// headers are unfinished. A body h leaves unread is not read at all:
// net/http reads up to 256 KiB of it after h, to keep the connection,
// until ReadTimeout, while the connection counted as serving, so clients
// that trickled bodies our handlers never read held every slot (/livez
// answered after 37 s under 400 of them). The read deadline, set past,
// makes that read fail at once: the answer goes out and the connection
// closes (a body that came whole with its headers is already read).
func serveCapped(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := r.Context().Value(connKey{}).(*cappedConn)
		if !ok {
			h.ServeHTTP(w, r)
			return
		}
		// Until the connection goes idle (track), not until h returns:
		// the response is still being flushed then.
		c.serving.Store(true)
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		body := &cappedBody{ReadCloser: r.Body, c: c}
		r.Body = body
		h.ServeHTTP(w, r)
		r.Body = body.ReadCloser // net/http looks at its own body type after h
		if !body.ended {
			_ = c.SetReadDeadline(time.Now())
		}
	})
}

// cappedBody is a request body that marks its connection as reading, not
// serving, while a read of it waits, and notes its end.
type cappedBody struct {
	io.ReadCloser
	c     *cappedConn
	ended bool
}

func (b *cappedBody) Read(p []byte) (int, error) {
	b.c.serving.Store(false)
	n, err := b.ReadCloser.Read(p)
	b.c.serving.Store(true)
	if err == io.EOF {
		b.ended = true
	}
	return n, err
}

// withConn is the server's ConnContext: it puts the connection in each of
// its requests' context, for serveCapped.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}
