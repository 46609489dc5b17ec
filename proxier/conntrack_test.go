package proxier

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
)

type fakeConntrack struct {
	mu      sync.Mutex
	cleared []string
}

func (f *fakeConntrack) ClearUDP(addr netip.Addr, port int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleared = append(f.cleared, fmt.Sprintf("%v:%d", addr, port))
	return nil
}

func TestNewUDPSocketClearsStaleConntrack(t *testing.T) {
	ct := &fakeConntrack{}
	p, _ := newPortalProxier(t)
	p.opts.Conntrack = ct
	svc := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053))
	p.OnServiceAdd(svc)
	p.OnServiceAdd(makeService("web", withClusterIP("10.96.0.20")))
	p.Sync()
	want := []string{"10.96.0.10:80", "invalid IP:30053"}
	if !slices.Equal(ct.cleared, want) {
		t.Fatalf("cleared %v, want %v (UDP only, service IPs and the NodePort)", ct.cleared, want)
	}
	// A sync that keeps the socket clears nothing.
	p.OnServiceUpdate(svc, svc)
	p.Sync()
	if len(ct.cleared) != len(want) {
		t.Fatalf("an unchanged UDP socket cleared conntrack again: %v", ct.cleared)
	}
}
