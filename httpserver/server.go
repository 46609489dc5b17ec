package httpserver

import (
	"net"
	"net/http"
	"time"
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
	// MaxHeaderBytes bounds a request's headers (net/http adds 4 KiB of
	// slack); past it the client gets 431. 0 is net/http's 1 MiB.
	MaxHeaderBytes int
	// MaxConns caps open connections; 0 means no cap. At the cap a new
	// client takes the place of the longest-idle keep-alive connection,
	// else of the longest-reading one (headers unfinished), or waits while
	// every connection is serving a request.
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
	// Probes, scrapers (a bearer token included) and Toxiproxy's client
	// send well under 1 KiB. net/http's 1 MiB let each connection hold
	// that much while its headers came: 100 clients that each sent an
	// unfinished 1 MB header line took the proxy from 33 MB to 237 MB,
	// and every healthCheckNodePort is a server with its own cap.
	MaxHeaderBytes: 16 << 10,
	MaxConns:       100,
}

// New returns an http.Server for h with l's timeouts; Serve and Start
// apply the connection cap too.
func New(h http.Handler, l Limits) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// Serve serves h on ln under l in a goroutine (the cap applies too) and
// returns the server: Close it to stop it (that closes ln).
func Serve(ln net.Listener, h http.Handler, l Limits) *http.Server {
	srv := New(h, l)
	if l.MaxConns > 0 {
		capped := newCapListener(ln, l.MaxConns)
		srv.ConnState = capped.track
		srv.ConnContext = withConn
		srv.Handler = serveCapped(h)
		ln = capped
	}
	go func() { _ = srv.Serve(ln) }() // Serve closes ln when it returns
	return srv
}

// Start binds addr (TCP) and serves h on it under l in a goroutine. Binding
// happens before Start returns, so a taken port is the caller's error, not
// a silent gap. Close the returned server to stop it.
func Start(addr string, h http.Handler, l Limits) (*http.Server, net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	return Serve(ln, h, l), ln.Addr(), nil
}
