package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// The flood test's load: request/response probes timed against a quiet
// Service, forged-looking UDP sources and half-open TCP clients against a
// flooded one, and the proxy's descriptor count.

// latencies are the round-trip times of one kind of request.
type latencies struct {
	mu     sync.Mutex
	d      []time.Duration
	failed int
}

func (l *latencies) add(d time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failed++
		return
	}
	l.d = append(l.d, d)
}

// quantile of the successful samples (q in [0,1]).
func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func (l *latencies) String() string {
	return fmt.Sprintf("p50 %.2f ms, p99 %.2f ms (%d samples, %d failed)",
		millis(l.quantile(0.5)), millis(l.quantile(0.99)), len(l.d), l.failed)
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// probe times one request/response to a Service from a client namespace:
// TCP on a new connection (connect, one line each way, close), and UDP from
// a fresh source port per query, as DNS clients do; and the same straight
// to one of the Service's backends, not through the proxy (the control: how
// much the machine itself slows down). The probe runs on a thread inside ns
// for its whole life, so every socket it opens is there.
type probe struct {
	ns       *netns.NS
	src      netip.Addr
	tcp, udp netip.AddrPort // the Service
	direct   netip.AddrPort // a backend, TCP and UDP
	nextPort uint16
}

// probeSamples are one phase's samples of each kind of request.
type probeSamples struct {
	tcp, udp, directTCP, directUDP latencies
}

// run probes until stop is closed, one request at a time, each kind in
// turn, recording into the samples sink returns at the time.
func (p *probe) run(stop <-chan struct{}, sink func() *probeSamples) error {
	return p.ns.Do(func() error {
		for {
			select {
			case <-stop:
				return nil
			default:
			}
			s := sink()
			for _, r := range []struct {
				into *latencies
				ask  func(netip.AddrPort) error
				dst  netip.AddrPort
			}{{&s.tcp, p.askTCP, p.tcp}, {&s.udp, p.askUDP, p.udp}, {&s.directTCP, p.askTCP, p.direct}, {&s.directUDP, p.askUDP, p.direct}} {
				began := time.Now()
				err := r.ask(r.dst)
				r.into.add(time.Since(began), err)
			}
		}
	})
}

const probeTimeout = 2 * time.Second

func (p *probe) askTCP(dst netip.AddrPort) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: p.src.AsSlice()}, Timeout: probeTimeout}
	c, err := d.Dial("tcp", dst.String())
	if err != nil {
		return err
	}
	defer c.Close()
	return ask(c)
}

func (p *probe) askUDP(dst netip.AddrPort) error {
	// Ports 20000-29999 of the probe's own address: fresh each query, never
	// the kernel's random pick (a reused ip:port would be an old session).
	p.nextPort = 20000 + (p.nextPort+1)%10000
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: p.src.AsSlice(), Port: int(p.nextPort)})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(probeTimeout)); err != nil {
		return err
	}
	if _, err := c.WriteToUDPAddrPort([]byte("who\n"), dst); err != nil {
		return err
	}
	buf := make([]byte, 256)
	_, _, err = c.ReadFromUDPAddrPort(buf)
	return err
}

func ask(c net.Conn) error {
	if err := c.SetDeadline(time.Now().Add(probeTimeout)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("who\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

// udpFlood sends one datagram from each of len(srcs) × ports distinct
// source ip:ports (ports 10000, 10001, ... of each address) to dst, spread
// evenly over spread, and returns how many it sent. The datagrams are
// written whole (IP header included) on one raw socket, as a forged-source
// flood is: no client socket exists to read the replies, and the generator
// costs one system call per source, not four, on the machine it shares
// with the proxy.
func udpFlood(ns *netns.NS, srcs []netip.Addr, ports int, dst netip.AddrPort, spread time.Duration) (int, error) {
	var sent int
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrInet4{Addr: dst.Addr().As4()}
		total := len(srcs) * ports
		began := time.Now()
		for i := range total {
			// Pace: source i goes out no earlier than i/total of spread.
			if due := began.Add(spread * time.Duration(i) / time.Duration(total)); time.Until(due) > time.Millisecond {
				time.Sleep(time.Until(due))
			}
			src := netip.AddrPortFrom(srcs[i%len(srcs)], uint16(10000+i/len(srcs)))
			if err := unix.Sendto(fd, udpPacket(src, dst, []byte("flood\n")), 0, to); err != nil {
				return fmt.Errorf("source %v: %w", src, err)
			}
			sent++
		}
		return nil
	})
	return sent, err
}

// udpPacket is an IPv4 UDP datagram from src to dst. The kernel fills in
// the IP checksum, total length and id of a raw IPPROTO_RAW write; a zero
// UDP checksum means none (IPv4).
func udpPacket(src, dst netip.AddrPort, payload []byte) []byte {
	b := make([]byte, 28+len(payload))
	b[0] = 0x45 // IPv4, 20-byte header
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[8] = 64 // TTL
	b[9] = unix.IPPROTO_UDP
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:16], s4[:])
	copy(b[16:20], d4[:])
	binary.BigEndian.PutUint16(b[20:], src.Port())
	binary.BigEndian.PutUint16(b[22:], dst.Port())
	binary.BigEndian.PutUint16(b[24:], uint16(8+len(payload)))
	copy(b[28:], payload)
	return b
}

// halfOpen connects n TCP clients from srcs (in turn) to dst with `workers`
// dialers, client i no earlier than i/n of spread, and never sends on them;
// the connections are returned open.
func halfOpen(ctx context.Context, ns *netns.NS, srcs []netip.Addr, dst netip.AddrPort, n, workers int, spread time.Duration) ([]net.Conn, error) {
	began := time.Now()
	var mu sync.Mutex
	var conns []net.Conn
	var next atomic.Int64
	errs := make(chan error, workers)
	for range workers {
		go func() {
			errs <- ns.Do(func() error {
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return nil
					}
					if due := began.Add(spread * time.Duration(i) / time.Duration(n)); time.Until(due) > time.Millisecond {
						time.Sleep(time.Until(due))
					}
					d := net.Dialer{LocalAddr: &net.TCPAddr{IP: srcs[i%len(srcs)].AsSlice()}, Timeout: 5 * time.Second}
					c, err := d.DialContext(ctx, "tcp", dst.String())
					if err != nil {
						return fmt.Errorf("half-open client %d: %w", i, err)
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
				}
			})
		}()
	}
	var first error
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return conns, first
}

// fdCount is how many descriptors process pid holds.
func fdCount(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("descriptors of %d: %v", pid, err)
	}
	return len(ents)
}

// fdPeak samples pid's descriptor count every interval until stop is
// closed and returns the highest count seen.
func fdPeak(t *testing.T, pid int, interval time.Duration, stop <-chan struct{}) <-chan int {
	out := make(chan int, 1)
	go func() {
		peak := 0
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
				peak = max(peak, len(ents))
			}
			select {
			case <-stop:
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// needNofile makes sure this process's descriptor limit is at least n (Go
// raises the soft limit to the hard one; root may raise the hard one too),
// so that the flood's clients, the backends and the proxy — which inherit it
// — are bounded by their own caps, not by the runner's limit. It skips when
// the limit cannot reach n; a raised limit is restored at the end.
func needNofile(t *testing.T, n uint64) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	if old.Cur >= n {
		return
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: max(n, old.Max)}); err != nil {
		t.Skipf("the descriptor limit is %d and cannot be raised to %d: %v", old.Cur, n, err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NOFILE, &old) })
}

// cpuTime is the CPU time (user + system) process pid has used.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("stat of %d: %v", pid, err)
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: utime and stime are fields 14 and 15 of the whole line.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}
