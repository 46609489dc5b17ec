package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// udpLoadConfig sizes one UDP request/response run.
type udpLoadConfig struct {
	target   *net.UDPAddr
	flows    int           // client sockets, each its own proxy session / conntrack entry
	window   int           // datagrams in flight per flow
	size     int           // datagram size
	duration time.Duration // how long new datagrams are sent
	timeout  time.Duration // silence after which a flow's window is presumed lost
}

// udpLoadResult counts one run. Loss is what never came back, measured after
// a drain of one timeout, so late replies are not counted as lost.
type udpLoadResult struct {
	sent, received int64
	elapsed        time.Duration
}

func (r udpLoadResult) rate() float64 { return float64(r.received) / r.elapsed.Seconds() }

func (r udpLoadResult) lossPercent() float64 {
	if r.sent == 0 {
		return 0
	}
	return 100 * float64(r.sent-r.received) / float64(r.sent)
}

// runUDPLoad runs a closed-loop request/response load: each flow keeps
// -window datagrams in flight and sends a new one for every reply.
func runUDPLoad(args []string) error {
	fs := flag.NewFlagSet("udp-load", flag.ExitOnError)
	target := fs.String("target", "", "IP:port of the UDP echo service")
	cfg := udpLoadConfig{}
	fs.IntVar(&cfg.flows, "flows", 16, "client sockets")
	fs.IntVar(&cfg.window, "window", 4, "datagrams in flight per flow")
	fs.IntVar(&cfg.size, "size", 64, "datagram size in bytes")
	fs.DurationVar(&cfg.duration, "duration", 8*time.Second, "sending time")
	fs.DurationVar(&cfg.timeout, "timeout", 200*time.Millisecond, "silence that counts a flow's window as lost")
	_ = fs.Parse(args)
	ua, err := net.ResolveUDPAddr("udp", *target)
	if err != nil {
		return err
	}
	cfg.target = ua
	res, err := udpLoad(cfg)
	if err != nil {
		return err
	}
	// One machine-readable line: rate/s and loss %.
	fmt.Printf("%.0f %.4f\n", res.rate(), res.lossPercent())
	fmt.Fprintf(os.Stderr, "udp-load: sent=%d received=%d in %v\n", res.sent, res.received, res.elapsed)
	return nil
}

func udpLoad(cfg udpLoadConfig) (udpLoadResult, error) {
	conns := make([]*net.UDPConn, cfg.flows)
	for i := range conns {
		c, err := net.DialUDP("udp", nil, cfg.target)
		if err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			return udpLoadResult{}, err
		}
		conns[i] = c
	}
	var (
		mu    sync.Mutex
		total udpLoadResult
		wg    sync.WaitGroup
	)
	start := time.Now()
	stop := start.Add(cfg.duration)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			s, r := runFlow(c, cfg, stop)
			mu.Lock()
			total.sent += s
			total.received += r
			mu.Unlock()
		}()
	}
	wg.Wait()
	total.elapsed = cfg.duration
	return total, nil
}

// runFlow drives one client socket until stop, then drains.
func runFlow(c *net.UDPConn, cfg udpLoadConfig, stop time.Time) (sent, received int64) {
	out := make([]byte, cfg.size)
	in := make([]byte, 64*1024)
	send := func(n int) {
		for range n {
			if _, err := c.Write(out); err == nil {
				sent++
			}
		}
	}
	send(cfg.window)
	for {
		now := time.Now()
		draining := !now.Before(stop)
		if draining && sent == received {
			return sent, received
		}
		_ = c.SetReadDeadline(now.Add(cfg.timeout))
		_, err := c.Read(in)
		switch {
		case err == nil:
			received++
			if !draining {
				send(1)
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			if draining {
				return sent, received
			}
			send(cfg.window) // presume the window lost and refill it
		default:
			// ICMP refused and the like: the datagram is gone; refill one.
			if draining {
				return sent, received
			}
			send(1)
		}
	}
}
