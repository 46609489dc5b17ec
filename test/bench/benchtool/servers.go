package main

import (
	"flag"
	"fmt"
	"net"
	"runtime"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
)

// runHTTP serves a small fixed response on every path (backend.NewHTTPServer).
func runHTTP(args []string) error {
	fs := flag.NewFlagSet("http", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "IP:port to listen on")
	size := fs.Int("size", 64, "response body size in bytes")
	_ = fs.Parse(args)

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Printf("READY http %s\n", *addr)
	return backend.NewHTTPServer(*size).Serve(ln)
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
	return backend.EchoUDP(conn, runtime.GOMAXPROCS(0))
}
