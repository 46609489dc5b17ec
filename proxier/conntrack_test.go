package proxier

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

type fakeConntrack struct {
	mu      sync.Mutex
	cleared []string
}

func (f *fakeConntrack) record(proto string, addr netip.Addr, port int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleared = append(f.cleared, fmt.Sprintf("%s %v:%d", proto, addr, port))
	return nil
}

func (f *fakeConntrack) ClearUDP(addr netip.Addr, port int) error { return f.record("udp", addr, port) }
func (f *fakeConntrack) ClearUnNATedTCP(addr netip.Addr, port int) error {
	return f.record("tcp-unnated", addr, port)
}

// take returns what was cleared since the last call, sorted.
func (f *fakeConntrack) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.cleared
	f.cleared = nil
	slices.Sort(out)
	return out
}

func TestNewSocketClearsStaleConntrack(t *testing.T) {
	ct := &fakeConntrack{}
	p, _ := newPortalProxier(t)
	p.opts.Conntrack = ct
	svc := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053))
	p.OnServiceAdd(svc)
	p.OnServiceAdd(makeService("web", withClusterIP("10.96.0.20"), withNodePort(30080)))
	p.Sync()
	// UDP: every entry to the service IPs and the NodePort; TCP: the
	// un-NATed entries of the service IPs only (no NodePort).
	want := []string{"tcp-unnated 10.96.0.20:80", "udp 10.96.0.10:80", "udp invalid IP:30053"}
	if got := ct.take(); !slices.Equal(got, want) {
		t.Fatalf("cleared %v, want %v", got, want)
	}
	// A sync that keeps the sockets clears nothing.
	p.OnServiceUpdate(svc, svc)
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("unchanged sockets cleared conntrack again: %v", got)
	}
}

// The ports to clear are kept until a portal sync succeeds: clearing before
// the rules are in would let new flows be tracked un-NATed again, and
// forgetting them would leave the stale entries.
func TestConntrackClearingWaitsForSuccessfulSync(t *testing.T) {
	ct := &fakeConntrack{}
	p, fake := newPortalProxier(t)
	p.opts.Conntrack = ct
	fake.Errors = map[string]error{"Restore": errors.New("injected restore failure")}
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a failed sync cleared %v", got)
	}
	p.OnServiceAdd(makeService("web", withClusterIP("10.96.0.20")))
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a failed sync cleared %v", got)
	}
	fake.Errors = nil
	p.Sync()
	want := []string{"tcp-unnated 10.96.0.20:80", "udp 10.96.0.10:80"}
	if got := ct.take(); !slices.Equal(got, want) {
		t.Fatalf("after the first successful sync cleared %v, want %v", got, want)
	}
	if rules := fake.Rules(iptables.TableNAT, iptables.ChainPortalsContainer); len(rules) != 2 {
		t.Fatalf("portals not written: %q", rules)
	}
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a second successful sync cleared %v again", got)
	}
}
