package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// Timeouts of one request. A request that must succeed gets AnswerTimeout; a
// poll while a change propagates gets PollTimeout and is retried from a new
// socket after PollGap: a packet sent before its portal rule exists is
// forwarded un-NATed, and its conntrack entry would keep retransmissions off
// the new rule, so waiting longer on one socket only inflates the measured
// latency (PollTimeout bounds its error).
const (
	AnswerTimeout = 3 * time.Second
	PollTimeout   = 100 * time.Millisecond
	PollGap       = 10 * time.Millisecond
)

// Client is where requests start: a namespace and, when set, the source
// address (the proxy keys ClientIP affinity on it). Every request is a new
// TCP connection or comes from a new UDP socket.
type Client struct {
	Label string // how messages name the client; empty: namespace[source]
	NS    *netns.NS
	Src   netip.Addr // zero: the kernel chooses
	// SrcPort fixes the UDP source port (zero: a fresh port per request), for
	// a client that keeps its port as many DNS resolvers do. TCP requests
	// refuse it: TIME_WAIT would make a fixed TCP port fail.
	SrcPort uint16
}

func (c Client) String() string {
	switch {
	case c.Label != "":
		return c.Label
	case c.Src.IsValid():
		return fmt.Sprintf("%s[%s]", c.NS.Name, c.Src)
	}
	return c.NS.Name
}

// AskTCP opens a new connection to dst and returns the backend's answer.
func (c Client) AskTCP(dst netip.AddrPort, timeout time.Duration) (backend.Answer, error) {
	if c.SrcPort != 0 {
		return backend.Answer{}, errors.New("harness: a fixed source port is for UDP only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := c.NS.DialTCP(ctx, c.Src, dst)
	if err != nil {
		return backend.Answer{}, err
	}
	return backend.AskTCP(conn, timeout)
}

// AskUDP sends one datagram to dst and returns the answer and the address it
// came from (for a Service, the address the client sent to; Ask checks that).
func (c Client) AskUDP(dst netip.AddrPort, timeout time.Duration) (backend.Answer, netip.AddrPort, error) {
	u, err := c.listenUDP()
	if err != nil {
		return backend.Answer{}, netip.AddrPort{}, err
	}
	defer u.Close()
	return backend.AskUDP(u, dst, timeout)
}

// listenUDP opens the request's socket: on SrcPort, or on a port this
// process has not used lately. The kernel's bind(0) picks at random, so 30
// requests reuse a port about once in 60 runs, and a reused ip:port is the
// proxy's existing session, not a new client (round robin came out 10/9/11).
func (c Client) listenUDP() (*net.UDPConn, error) {
	if c.SrcPort != 0 {
		return c.NS.ListenUDPAt(netip.AddrPortFrom(c.Src, c.SrcPort))
	}
	var err error
	for range 50 {
		var u *net.UDPConn
		if u, err = c.NS.ListenUDPAt(netip.AddrPortFrom(c.Src, freshUDPPort())); err == nil {
			return u, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, err
		}
	}
	return nil, err
}

// Fresh client ports rotate through a range below Linux's default
// ephemeral range (32768-60999), from a random start per process so that
// test binaries running side by side rarely meet.
const freshPortLow, freshPortCount = 20000, 12000

var freshPortNext atomic.Uint32

func init() { freshPortNext.Store(uint32(rand.IntN(freshPortCount))) }

func freshUDPPort() uint16 {
	return uint16(freshPortLow + freshPortNext.Add(1)%freshPortCount)
}

// Ask is AskTCP or AskUDP by protocol name ("tcp", "udp") and returns the
// name of the backend that answered. A UDP answer must come from dst itself.
func (c Client) Ask(proto string, dst netip.AddrPort, timeout time.Duration) (string, error) {
	if proto == "udp" {
		a, from, err := c.AskUDP(dst, timeout)
		if err != nil {
			return "", err
		}
		if from != dst {
			return "", fmt.Errorf("udp answer from %s, want %s", from, dst)
		}
		return a.Backend, nil
	}
	a, err := c.AskTCP(dst, timeout)
	return a.Backend, err
}

// MustAsk is Ask with AnswerTimeout that fails t on error.
func (c Client) MustAsk(t testing.TB, proto string, dst netip.AddrPort) string {
	t.Helper()
	name, err := c.Ask(proto, dst, AnswerTimeout)
	if err != nil {
		t.Fatalf("%s %s from %s: %v", proto, dst, c, err)
	}
	return name
}

// WaitFor asks dst every PollGap, each attempt bounded by PollTimeout, until
// ok accepts an attempt's outcome, and returns how long that took from since;
// it fails t after within, saying the service was not what.
func (c Client) WaitFor(t testing.TB, proto string, dst netip.AddrPort, since time.Time, within time.Duration,
	what string, ok func(name string, err error) bool) time.Duration {
	t.Helper()
	deadline := since.Add(within)
	for {
		name, err := c.Ask(proto, dst, PollTimeout)
		if ok(name, err) {
			return time.Since(since)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s from %s: not %s within %v (last: %q, %v)", proto, dst, c, what, within, name, err)
		}
		time.Sleep(PollGap)
	}
}

// WaitServed waits until dst answers at all.
func (c Client) WaitServed(t testing.TB, proto string, dst netip.AddrPort, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	return c.WaitFor(t, proto, dst, since, within, "served", func(_ string, err error) bool { return err == nil })
}

// WaitUnserved waits until dst stops answering.
func (c Client) WaitUnserved(t testing.TB, proto string, dst netip.AddrPort, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	return c.WaitFor(t, proto, dst, since, within, "unserved", func(_ string, err error) bool { return err != nil })
}
