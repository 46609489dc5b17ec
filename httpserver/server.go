package httpserver

import (
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Limits bound one HTTP server.
type Limits struct {
	// ReadHeaderTimeout cuts a client that has not sent its request headers
	// in time (slowloris).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout time.Duration
	// WriteTimeout bounds a response from the end of its request headers.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no next request.
	IdleTimeout time.Duration
	// MaxConns caps open connections; 0 means no cap.
	MaxConns int
}

// DefaultLimits suit every server we run: requests are small GETs and JSON
// bodies of a few KiB, responses are rendered at once (no streaming, no
// pprof), and clients are probes, scrapers and operators, a few dozen at
// most.
var DefaultLimits = Limits{
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       10 * time.Second,
	WriteTimeout:      30 * time.Second,
	IdleTimeout:       30 * time.Second,
	MaxConns:          100,
}

// New returns an http.Server for h with l's timeouts. Serve it on a
// listener from Listen (or use Start) so the connection cap applies too.
func New(h http.Handler, l Limits) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
	}
}

// Limit wraps ln so that at most l.MaxConns accepted connections are open
// at once; Accept waits for one to close before taking the next.
func Limit(ln net.Listener, l Limits) net.Listener {
	if l.MaxConns <= 0 {
		return ln
	}
	return netutil.LimitListener(ln, l.MaxConns)
}

// Start binds addr (TCP) and serves h on it under l in a goroutine. Binding
// happens before Start returns, so a taken port is the caller's error, not
// a silent gap. Close the returned server to stop it.
func Start(addr string, h http.Handler, l Limits) (*http.Server, net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	srv := New(h, l)
	go func() { _ = srv.Serve(Limit(ln, l)) }() // Serve closes ln when it returns
	return srv, ln.Addr(), nil
}
