package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// runIdle opens -conns keep-alive connections to an HTTP service, makes one
// request on each (so the proxy has dialed its backend side too), prints
// "READY ok failed" and then holds them, idle, until SIGTERM or -hold.
func runIdle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	target := fs.String("target", "", "IP:port of the HTTP service")
	n := fs.Int("conns", 10000, "connections to open")
	parallel := fs.Int("parallel", 64, "connections being opened at once")
	hold := fs.Duration("hold", 5*time.Minute, "give up holding after this long")
	_ = fs.Parse(args)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	conns := make([]net.Conn, *n)
	var failed atomic.Int64
	var firstErr atomic.Value
	sem := make(chan struct{}, *parallel)
	var wg sync.WaitGroup
	for i := range conns {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := openIdle(*target)
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	fmt.Printf("READY %d %d\n", int64(*n)-failed.Load(), failed.Load())
	if err, ok := firstErr.Load().(error); ok {
		fmt.Fprintf(os.Stderr, "idle: first error: %v\n", err)
	}
	select {
	case <-sigs:
	case <-time.After(*hold):
	}
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	return nil
}

// openIdle connects and completes one keep-alive request.
func openIdle(target string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /idle HTTP/1.1\r\nHost: bench\r\n\r\n"); err != nil {
		c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 1024), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetDeadline(time.Time{})
	return c, nil
}
