package backend

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"
)

// The benchmarks' servers do not name themselves: wrk, iperf3 and the UDP
// load generator count bytes and answers, and every extra byte would be
// measured too.

// NewHTTPServer returns an HTTP server that answers every path with 200 and a
// body of size bytes. Keep-alive stays on (wrk's keep-alive figure needs it)
// and idle connections are kept for a long time, so that an idle-connection
// figure measures the proxy, not the backend closing them.
func NewHTTPServer(size int) *http.Server {
	body := make([]byte, size)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	length := strconv.Itoa(len(body))
	return &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", length)
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write(body)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       30 * time.Minute,
	}
}

// EchoUDP sends every datagram on conn back to its sender, with readers
// goroutines reading the one socket (so echoing is not bound to one CPU),
// until conn is closed; then it returns net.ErrClosed. Other read errors (an
// ICMP error queued on the socket, say) are skipped.
func EchoUDP(conn *net.UDPConn, readers int) error {
	errs := make(chan error, readers)
	for range readers {
		go func() {
			buf := make([]byte, 64*1024)
			for {
				n, from, err := conn.ReadFromUDPAddrPort(buf)
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						errs <- err
						return
					}
					continue
				}
				_, _ = conn.WriteToUDPAddrPort(buf[:n], from)
			}
		}()
	}
	return <-errs
}
