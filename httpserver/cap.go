package httpserver

import (
	"net"
	"net/http"
	"sync"
)

// capListener caps open connections at max. A client accepted at the cap
// takes the place of the connection idle the longest (a keep-alive
// connection between requests), which is closed; only when every open
// connection is busy with a request (each bounded by the timeouts) does it
// wait for one to end or go idle. Waiting alone (netutil.LimitListener) let 100
// clients that each sent a request every IdleTimeout hold every slot for
// as long as they liked: kubelet's and load balancers' probes of /healthz
// and of the healthCheckNodePorts then hung.
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
	// the order they became idle.
	idle []*cappedConn
}

func newCapListener(ln net.Listener, max int) *capListener {
	return &capListener{Listener: ln, slots: make(chan struct{}, max),
		idled: make(chan struct{}, 1), done: make(chan struct{})}
}

func (l *capListener) Accept() (net.Conn, error) {
	// The client first, then its slot: a slot taken ahead closed an idle
	// connection at the cap with no one waiting (the cap was one less,
	// and keep-alive clients at the cap pushed each other out in turn).
	// Waiting, this holds one accepted client beyond the cap.
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	for {
		select {
		case l.slots <- struct{}{}:
			return &cappedConn{Conn: c, l: l}, nil
		default:
		}
		if oldest := l.oldestIdle(); oldest != nil {
			_ = oldest.Close() // gives its slot back
			continue
		}
		// Every connection is busy with a request: wait for one to end,
		// or to finish its request and go idle.
		select {
		case l.slots <- struct{}{}:
			return &cappedConn{Conn: c, l: l}, nil
		case <-l.idled:
		case <-l.done:
			c.Close()
			return nil, net.ErrClosed
		}
	}
}

func (l *capListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
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
	if state == http.StateIdle {
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
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.l.slots })
	return err
}
