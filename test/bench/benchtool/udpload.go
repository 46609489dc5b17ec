package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// udpLoadConfig sizes one UDP request/response run.
type udpLoadConfig struct {
	target   *net.UDPAddr
	flows    int           // client sockets, each its own proxy session / conntrack entry
	window   int           // datagrams in flight per flow
	size     int           // datagram size
	gso      int           // datagrams per send: >1 sends them as one UDP GSO buffer (UDP_SEGMENT), as QUIC stacks do
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
	fs.IntVar(&cfg.gso, "gso", 1, "datagrams per send: >1 sends up to that many as one UDP GSO buffer, and a flow sends again once that many replies came")
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

// runFlow drives one client socket until stop, then drains. With gso > 1
// it sends in GSO buffers of gso datagrams and refills the window once
// gso replies came (owed counts them).
func runFlow(c *net.UDPConn, cfg udpLoadConfig, stop time.Time) (sent, received int64) {
	burst := max(cfg.gso, 1)
	out := make([]byte, cfg.size*burst)
	segment := gsoSegment(cfg.size)
	in := make([]byte, 64*1024)
	send := func(n int) {
		for n > 0 {
			k := min(n, burst)
			var err error
			if k > 1 {
				_, _, err = c.WriteMsgUDP(out[:k*cfg.size], segment, nil)
			} else {
				_, err = c.Write(out[:cfg.size])
			}
			if err == nil {
				sent += int64(k)
			}
			n -= k
		}
	}
	owed := 0
	reply := func() {
		if owed++; owed >= burst {
			send(owed)
			owed = 0
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
				reply()
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			if draining {
				return sent, received
			}
			send(cfg.window) // presume the window lost and refill it
			owed = 0
		default:
			// ICMP refused and the like: the datagram is gone; refill one.
			if draining {
				return sent, received
			}
			reply()
		}
	}
}

// gsoSegment is the UDP_SEGMENT control message that cuts a send into
// datagrams of size bytes.
func gsoSegment(size int) []byte {
	b := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&b[unix.CmsgLen(0)])) = uint16(size)
	return b
}
