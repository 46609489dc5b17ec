package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// askTimeout bounds one request when the service is expected to answer;
// pollTimeout bounds one attempt while waiting for a change to take effect,
// and so the error of every latency figure.
const (
	askTimeout  = 3 * time.Second
	pollTimeout = 100 * time.Millisecond
)

// client is a place traffic starts from: a namespace and, optionally, the
// source address to use (the proxy keys affinity on it).
type client struct {
	label string
	ns    *netns.NS
	src   netip.Addr // zero: kernel's choice
}

// askTCP opens a new connection to dst and returns which backend answered.
func (cl client) askTCP(dst netip.AddrPort) (backend.Answer, error) {
	return cl.askTCPWithin(dst, askTimeout)
}

// askTCPWithin is askTCP with its own timeout, for polling: a SYN sent
// before a portal rule exists is forwarded un-NATed and dropped, and its
// conntrack entry keeps the retransmissions off the new rule, so a poll must
// give up quickly and retry from a new source port.
func (cl client) askTCPWithin(dst netip.AddrPort, timeout time.Duration) (backend.Answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := cl.ns.DialTCP(ctx, cl.src, dst)
	if err != nil {
		return backend.Answer{}, err
	}
	return backend.AskTCP(c, timeout)
}

// askUDP sends one datagram from a fresh socket (so a new source port, a new
// UDP session for the proxy) and returns the answer and its source address.
func (cl client) askUDP(dst netip.AddrPort, timeout time.Duration) (backend.Answer, netip.AddrPort, error) {
	u, err := cl.ns.ListenUDP(cl.src)
	if err != nil {
		return backend.Answer{}, netip.AddrPort{}, err
	}
	defer u.Close()
	return backend.AskUDP(u, dst, timeout)
}

// ask is askTCP or askUDP by protocol name; for UDP it also checks that the
// reply came from dst (the address the client sent to).
func (cl client) ask(proto string, dst netip.AddrPort) (string, error) {
	return cl.askWithin(proto, dst, askTimeout)
}

func (cl client) askWithin(proto string, dst netip.AddrPort, timeout time.Duration) (string, error) {
	if proto == "udp" {
		a, from, err := cl.askUDP(dst, timeout)
		if err != nil {
			return "", err
		}
		if from != dst {
			return "", fmt.Errorf("udp reply from %s, want %s", from, dst)
		}
		return a.Backend, nil
	}
	a, err := cl.askTCPWithin(dst, timeout)
	return a.Backend, err
}

// counts tallies answers by backend name; failures count under "ERR".
type counts map[string]int

func (c counts) String() string {
	names := make([]string, 0, len(c))
	for k := range c {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s=%d", k, c[k])
	}
	return strings.Join(parts, " ")
}

// sorted returns the counts of answering backends, largest first.
func (c counts) sorted() []int {
	var out []int
	for k, v := range c {
		if k != "ERR" {
			out = append(out, v)
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(out)))
	return out
}

// distribution asks dst n times, sequentially, each over a new connection
// (TCP) or from a new source port (UDP). The first error is returned too.
func distribution(cl client, proto string, dst netip.AddrPort, n int) (counts, error) {
	got := counts{}
	var first error
	for i := 0; i < n; i++ {
		name, err := cl.ask(proto, dst)
		if err != nil {
			got["ERR"]++
			if first == nil {
				first = fmt.Errorf("attempt %d: %w", i+1, err)
			}
			continue
		}
		got[name]++
	}
	return got, first
}

// waitServing asks until dst answers (or fails the test after within).
func waitServing(t *testing.T, cl client, proto string, dst netip.AddrPort, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		_, err := cl.askWithin(proto, dst, pollTimeout)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s from %s: not serving within %v: %v", proto, dst, cl.label, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// figure logs one line for the closing note.
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("FIGURE "+format, args...)
}
