package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"time"
)

// runHTTP serves a small fixed response on every path. Keep-alive stays on
// (wrk's keep-alive figure needs it) and idle connections are kept for a
// long time, so that the idle-connection figure measures the proxy, not the
// backend closing them.
func runHTTP(args []string) error {
	fs := flag.NewFlagSet("http", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "IP:port to listen on")
	size := fs.Int("size", 64, "response body size in bytes")
	_ = fs.Parse(args)

	body := make([]byte, *size)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	length := strconv.Itoa(len(body))
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", length)
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write(body)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       30 * time.Minute,
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Printf("READY http %s\n", *addr)
	return srv.Serve(ln)
}

// runUDPEcho sends every datagram back to its sender, with one reader per
// CPU on the same socket.
func runUDPEcho(args []string) error {
	fs := flag.NewFlagSet("udp-echo", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:5353", "IP:port to listen on")
	_ = fs.Parse(args)

	ua, err := net.ResolveUDPAddr("udp", *addr)
	if err != nil {
		return err
	}
	conn, err := net.ListenUDP("udp", ua)
	if err != nil {
		return err
	}
	fmt.Printf("READY udp-echo %s\n", *addr)
	errs := make(chan error, runtime.GOMAXPROCS(0))
	for range runtime.GOMAXPROCS(0) {
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
