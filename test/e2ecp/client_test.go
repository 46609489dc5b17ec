package e2ecp

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// Timeouts of one request. A request that must succeed gets answerTimeout; a poll while a
// change propagates gets pollTimeout and is retried from a new socket: a packet sent
// before its portal rule exists is forwarded un-NATed and its conntrack entry would keep
// retransmissions off the new rule, so waiting longer on one socket only inflates the
// measured latency (pollTimeout bounds its error).
const (
	answerTimeout = 3 * time.Second
	pollTimeout   = 100 * time.Millisecond
	pollGap       = 10 * time.Millisecond
)

// client is where requests start: a namespace and, when set, the source address.
type client struct {
	ns  *netns.NS
	src netip.Addr // zero: the kernel chooses
}

func (c client) String() string {
	if c.src.IsValid() {
		return fmt.Sprintf("%s[%s]", c.ns.Name, c.src)
	}
	return c.ns.Name
}

// ask sends one request over a new TCP connection or from a new UDP socket and returns
// the name of the backend that answered. A UDP answer must come from dst itself.
func (c client) ask(proto string, dst netip.AddrPort, timeout time.Duration) (string, error) {
	if proto == "udp" {
		u, err := c.ns.ListenUDP(c.src)
		if err != nil {
			return "", err
		}
		defer u.Close()
		a, from, err := backend.AskUDP(u, dst, timeout)
		if err != nil {
			return "", err
		}
		if from != dst {
			return "", fmt.Errorf("udp answer from %s, want %s", from, dst)
		}
		return a.Backend, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := c.ns.DialTCP(ctx, c.src, dst)
	if err != nil {
		return "", err
	}
	a, err := backend.AskTCP(conn, timeout)
	return a.Backend, err
}

// mustAsk is ask with answerTimeout that fails t on error.
func (c client) mustAsk(t *testing.T, proto string, dst netip.AddrPort) string {
	t.Helper()
	name, err := c.ask(proto, dst, answerTimeout)
	if err != nil {
		t.Fatalf("%s %s from %s: %v", proto, dst, c, err)
	}
	return name
}

// waitFor polls dst until ok accepts an attempt's outcome and returns how long that took
// from since; it fails t after within.
func (c client) waitFor(t *testing.T, proto string, dst netip.AddrPort, since time.Time, within time.Duration,
	what string, ok func(name string, err error) bool) time.Duration {
	t.Helper()
	deadline := since.Add(within)
	for {
		name, err := c.ask(proto, dst, pollTimeout)
		if ok(name, err) {
			return time.Since(since)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s from %s: not %s within %v (last: %q, %v)", proto, dst, c, what, within, name, err)
		}
		time.Sleep(pollGap)
	}
}

// waitServed waits until dst answers at all.
func (c client) waitServed(t *testing.T, proto string, dst netip.AddrPort, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	return c.waitFor(t, proto, dst, since, within, "served", func(_ string, err error) bool { return err == nil })
}

// waitUnserved waits until dst stops answering.
func (c client) waitUnserved(t *testing.T, proto string, dst netip.AddrPort, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	return c.waitFor(t, proto, dst, since, within, "unserved", func(_ string, err error) bool { return err != nil })
}
