package proxier

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

func TestPortAllocatorOpenPreferred(t *testing.T) {
	inUse := fmt.Errorf("listen: %w", syscall.EADDRINUSE)
	// Candidates 65532-65535 above a fake ephemeral range 1024-65531.
	pool := func() *PortAllocator {
		return NewNodePortAllocator(kernelPorts{Ephemeral: PortRange{Base: 1024, Size: 65532 - 1024}})
	}
	for _, tc := range []struct {
		name      string
		alloc     *PortAllocator
		preferred int
		ours      []int         // already handed out
		held      map[int]error // by other processes
		wantPort  int           // 0: any other port the allocator gives
	}{
		{"a free candidate", pool(), 65534, nil, nil, 65534},
		{"none preferred", pool(), 0, nil, nil, 0},
		{"not a candidate (in the ephemeral range)", pool(), 40000, nil, nil, 0},
		{"already ours", pool(), 65534, []int{65534}, nil, 0},
		{"held by another process", pool(), 65534, nil, map[int]error{65534: inUse}, 0},
		{"in the explicit range", NewPortAllocator(PortRange{Base: 5000, Size: 10}), 5003, nil, nil, 5003},
		{"outside the explicit range", NewPortAllocator(PortRange{Base: 5000, Size: 10}), 6000, nil, nil, 0},
		{"kernel-chosen only", NewPortAllocator(PortRange{}), 40000, nil, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range tc.ours {
				if !tc.alloc.take(p) {
					t.Fatalf("cannot hand out %d", p)
				}
			}
			b := &fakeBinder{held: tc.held, kernelPort: 40001}
			sock, err := tc.alloc.OpenPreferred(tc.preferred, b.listen)
			if err != nil {
				t.Fatal(err)
			}
			got := sock.Port()
			if tc.wantPort != 0 && got != tc.wantPort {
				t.Fatalf("port %d, want %d (tried %v)", got, tc.wantPort, b.tried)
			}
			if tc.wantPort == 0 && got == tc.preferred {
				t.Fatalf("port %d, want another (tried %v)", got, b.tried)
			}
			if got != 40001 && !tc.alloc.inUse[got] {
				t.Errorf("port %d not marked as ours", got)
			}
			if _, failed := tc.held[tc.preferred]; failed && tc.alloc.inUse[tc.preferred] {
				t.Errorf("port %d still marked after its listen failed", tc.preferred)
			}
			tc.alloc.Release(got)
			for _, s := range tc.alloc.pool {
				if s.used != len(tc.ours) {
					t.Errorf("segment %d-%d counts %d ports in use, want %d", s.lo, s.hi, s.used, len(tc.ours))
				}
			}
		})
	}
}

// A proxy started over the rules of the one before it listens on the proxy
// ports those rules name: its first sync writes nothing. A port someone
// else took meanwhile is replaced, and only its rules are rewritten.
func TestRestartKeepsProxyPorts(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	cfg := iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1")}
	services := []*v1.Service{
		makeService("a", withClusterIP("10.96.0.1")),
		makeService("b", withClusterIP("10.96.0.2"), withNodePort(30002)),
		makeService("dns", withClusterIP("10.96.0.3"), withProtocol(v1.ProtocolUDP)),
	}
	names := []string{"default/a:p", "default/b:p", "default/dns:p"}
	start := func() *Proxier {
		p := New(Options{BindAddress: mustAddr("127.0.0.1"), IPv4Portals: iptables.New(fake, cfg)})
		p.OnServiceSynced()
		p.OnEndpointSlicesSynced()
		for _, svc := range services {
			p.OnServiceAdd(svc)
		}
		p.Sync()
		return p
	}
	stop := func(p *Proxier) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		p.Run(ctx)
	}
	ports := func(p *Proxier) []int {
		var out []int
		for _, n := range names {
			port, ok := p.ProxyPort(n)
			if !ok {
				t.Fatalf("no proxy socket for %s", n)
			}
			out = append(out, port)
		}
		return out
	}

	first := start()
	before := ports(first)
	stop(first)

	fake.ResetCalls()
	second := start()
	if got := ports(second); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("proxy ports after a restart %v, want the rules' %v", got, before)
	}
	if w := fake.Writes(); len(w) != 0 {
		t.Errorf("a restart over right rules wrote %d times:\n%s", len(w), w)
	}
	stop(second)

	// Another process holds b's port now.
	other, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(before[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	fake.ResetCalls()
	third := start()
	defer stop(third)
	got := ports(third)
	if got[0] != before[0] || got[2] != before[2] || got[1] == before[1] {
		t.Errorf("proxy ports %v with %d held by another process, want %d and %d kept and another for b", got, before[1], before[0], before[2])
	}
	if len(fake.Writes()) == 0 {
		t.Errorf("b's rules were not rewritten for its new port %d", got[1])
	}
	if rules := fake.Rules(iptables.TableNAT, iptables.ChainPortalsHost); !containsSubstring(rules, ":"+strconv.Itoa(got[1])) {
		t.Errorf("no host portal names b's new port %d: %q", got[1], rules)
	}
}

func containsSubstring(list []string, sub string) bool {
	return slices.ContainsFunc(list, func(s string) bool { return strings.Contains(s, sub) })
}
