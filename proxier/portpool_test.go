package proxier

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

func TestReadKernelPorts(t *testing.T) {
	files := func(rng, reserved string) func(string) ([]byte, error) {
		return func(path string) ([]byte, error) {
			switch {
			case path == ephemeralRangePath && rng != "":
				return []byte(rng), nil
			case path == reservedPortsPath && reserved != "":
				return []byte(reserved), nil
			}
			return nil, os.ErrNotExist
		}
	}
	tests := []struct {
		name, rng, reserved string
		want                kernelPorts
		wantErr             bool
	}{
		{"default", "32768\t60999\n", "\n", kernelPorts{Ephemeral: PortRange{Base: 32768, Size: 28232}}, false},
		{"reserved", "40000 50000\n", "8080,9000-9002,bad,70000\n",
			kernelPorts{Ephemeral: PortRange{Base: 40000, Size: 10001},
				Reserved: []PortRange{{Base: 8080, Size: 1}, {Base: 9000, Size: 3}}}, false},
		{"no reserved file", "1024 65535", "", kernelPorts{Ephemeral: PortRange{Base: 1024, Size: 64512}}, false},
		{"no range", "", "", kernelPorts{}, true},
		{"garbage", "a b", "", kernelPorts{}, true},
		{"reversed", "5000 4000", "", kernelPorts{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readKernelPorts(files(tt.rng, tt.reserved))
			if (err != nil) != tt.wantErr || fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("got %+v, %v; want %+v, err=%v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// allocateAll drains a pool and returns the ports in the order handed out.
func allocateAll(t *testing.T, a *PortAllocator) []int {
	t.Helper()
	var got []int
	for {
		p, err := a.AllocateNext()
		if err != nil {
			t.Fatal(err)
		}
		if p == 0 {
			return got
		}
		got = append(got, p)
	}
}

func TestNodePortAllocatorStaysOutOfTheEphemeralRange(t *testing.T) {
	kp := kernelPorts{
		Ephemeral: PortRange{Base: 2000, Size: 63000}, // 2000-64999
		Reserved:  []PortRange{{Base: 1500, Size: 10}, {Base: 65500, Size: 1}},
	}
	a := NewNodePortAllocator(kp, PortRange{Base: 1100, Size: 100})
	got := allocateAll(t, a)
	// 65000-65535 minus 65500, then 1024-1999 minus 1100-1199 and 1500-1509.
	if want := 535 + 976 - 100 - 10; len(got) != want {
		t.Fatalf("handed out %d ports, want %d", len(got), want)
	}
	seen := map[int]bool{}
	for i, p := range got {
		switch {
		case seen[p]:
			t.Fatalf("port %d handed out twice", p)
		case p >= 2000 && p <= 64999:
			t.Fatalf("port %d is in the ephemeral range", p)
		case p < 1024 || (p >= 1100 && p < 1200) || (p >= 1500 && p < 1510) || p == 65500:
			t.Fatalf("port %d is avoided or reserved", p)
		case i < 535 && p < 65000, i >= 535 && p > 2000:
			t.Fatalf("port %d handed out as #%d: ports above the range come first", p, i)
		}
		seen[p] = true
	}
	// Full: the kernel chooses. A released port is handed out again.
	a.Release(1300)
	a.Release(0) // a kernel-chosen port is ignored
	if p, _ := a.AllocateNext(); p != 1300 {
		t.Fatalf("after releasing 1300 got %d", p)
	}
	if p, _ := a.AllocateNext(); p != 0 {
		t.Fatalf("full pool gave %d, want 0 (kernel-chosen)", p)
	}
}

func TestNodePortAllocatorSkipsWellKnownPorts(t *testing.T) {
	a := NewNodePortAllocator(kernelPorts{Ephemeral: PortRange{Base: 11000, Size: 55000 - 11000}})
	for _, p := range allocateAll(t, a) {
		if inAny(p, wellKnownNodePorts) {
			t.Fatalf("handed out %d, a well-known node port", p)
		}
	}
}

// fakeSocket is a proxy socket that only knows its port.
type fakeSocket int

func (s fakeSocket) Port() int    { return int(s) }
func (s fakeSocket) Start()       {}
func (s fakeSocket) Close() error { return nil }

// fakeBinder listens on any port but those held by others; port 0 gets
// kernelPort.
type fakeBinder struct {
	held       map[int]error
	kernelPort int
	tried      []int
}

func (b *fakeBinder) listen(port int) (proxySocket, error) {
	b.tried = append(b.tried, port)
	if err, ok := b.held[port]; ok {
		return nil, err
	}
	if port == 0 {
		return fakeSocket(b.kernelPort), nil
	}
	return fakeSocket(port), nil
}

func TestPortAllocatorOpen(t *testing.T) {
	inUse := fmt.Errorf("listen: %w", syscall.EADDRINUSE)
	// A pool of four ports above a fake ephemeral range 1024-65531.
	pool := func() *PortAllocator {
		return NewNodePortAllocator(kernelPorts{Ephemeral: PortRange{Base: 1024, Size: 65532 - 1024}})
	}
	// A pool of 100 ports, every one held by another process.
	widePool := func() *PortAllocator {
		return NewNodePortAllocator(kernelPorts{Ephemeral: PortRange{Base: 1024, Size: 65436 - 1024}})
	}
	// The same 100 ports held above the range, and one free port below it.
	twoSegments := func() *PortAllocator {
		return NewNodePortAllocator(kernelPorts{Ephemeral: PortRange{Base: 1025, Size: 65436 - 1025}})
	}
	tests := []struct {
		name      string
		alloc     *PortAllocator
		held      map[int]error
		wantPort  int // 0: any port of the pool
		wantTries int
		wantErr   bool
	}{
		{"free port", pool(), nil, 0, 1, false},
		{"three held by others are skipped", pool(),
			map[int]error{65532: inUse, 65533: inUse, 65534: syscall.EACCES}, 65535, 0, false},
		{"all held: the kernel chooses", pool(),
			map[int]error{65532: inUse, 65533: inUse, 65534: inUse, 65535: inUse}, 40000, 5, false},
		{"more held than tries: the kernel chooses", widePool(),
			map[int]error{}, 40000, maxPortTries + 1, false},
		{"a crowded segment: the next one is tried", twoSegments(),
			map[int]error{}, 1024, maxPortTries + 1, false},
		{"other errors are not retried", pool(),
			map[int]error{65532: syscall.EADDRNOTAVAIL, 65533: syscall.EADDRNOTAVAIL, 65534: syscall.EADDRNOTAVAIL, 65535: syscall.EADDRNOTAVAIL}, 0, 1, true},
		{"explicit range: one try", NewPortAllocator(PortRange{Base: 5000, Size: 1}),
			map[int]error{5000: inUse}, 0, 1, true},
		{"kernel-chosen only", NewPortAllocator(PortRange{}), nil, 40000, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBinder{held: tt.held, kernelPort: 40000}
			if tt.held != nil && len(tt.held) == 0 {
				for p := 65436; p <= 65535; p++ {
					b.held[p] = inUse
				}
			}
			sock, err := tt.alloc.Open(b.listen)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Open: %v, wantErr %v (tried %v)", err, tt.wantErr, b.tried)
			}
			seen := map[int]bool{}
			for _, p := range b.tried {
				if p != 0 && seen[p] {
					t.Errorf("port %d tried twice (tried %v)", p, b.tried)
				}
				seen[p] = true
			}
			if tt.wantTries != 0 && len(b.tried) != tt.wantTries {
				t.Errorf("tried %v, want %d tries", b.tried, tt.wantTries)
			}
			if err != nil {
				if tt.alloc.inUse[b.tried[0]] {
					t.Errorf("port %d still held after its listen failed", b.tried[0])
				}
				return
			}
			got := sock.Port()
			if tt.wantPort != 0 && got != tt.wantPort {
				t.Errorf("port %d, want %d (tried %v)", got, tt.wantPort, b.tried)
			}
			if tt.wantPort == 0 && (got < 65532 || !tt.alloc.inUse[got]) {
				t.Errorf("port %d is not a held port of the pool", got)
			}
			for p := range tt.held {
				if tt.alloc.inUse[p] {
					t.Errorf("port %d, held by another process, is still marked ours", p)
				}
			}
		})
	}
	if !errors.Is(inUse, syscall.EADDRINUSE) {
		t.Fatal("wrapped EADDRINUSE not recognised")
	}
}

// With --proxy-port-range a port another process holds (a daemon, or a
// TIME_WAIT of the node's own client when the range overlaps the ephemeral
// range) was handed out, failed, was released and was handed to the next
// service port of the same sync, and the next: five service ports of one
// sync failed on port 40112 while the range had free ports (sweep 10). Open
// now skips a held port for another free one of the range, as the default
// mode does, and fails only when every port it may try is held.
func TestExplicitRangeSkipsPortsHeldByOthers(t *testing.T) {
	inUse := fmt.Errorf("listen: %w", syscall.EADDRINUSE)
	for i := range 20 {
		a := NewPortAllocator(PortRange{Base: 5000, Size: 4})
		b := &fakeBinder{held: map[int]error{5000: inUse, 5001: inUse, 5003: syscall.EACCES}}
		sock, err := a.Open(b.listen)
		if err != nil {
			t.Fatalf("try %d: Open: %v (tried %v), want port 5002, the range's one free port", i, err, b.tried)
		}
		if sock.Port() != 5002 || len(b.tried) > 4 {
			t.Fatalf("try %d: port %d after trying %v, want 5002 with each port tried at most once", i, sock.Port(), b.tried)
		}
		for p := range b.held {
			if a.inUse[p] {
				t.Errorf("port %d, held by another process, is still marked ours", p)
			}
		}
	}
	// Every free port held: the error is the last listen's, and nothing stays marked.
	a := NewPortAllocator(PortRange{Base: 5000, Size: 3})
	b := &fakeBinder{held: map[int]error{5000: inUse, 5001: inUse, 5002: inUse}}
	if sock, err := a.Open(b.listen); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("Open with every port held: %v, %v (tried %v), want EADDRINUSE", sock, err, b.tried)
	}
	if len(b.tried) != 3 || len(a.inUse) != 0 {
		t.Errorf("tried %v, marked %v: want each of the 3 ports once, none left marked", b.tried, a.inUse)
	}
	// More held than maxPortTries: Open gives up after that many, as the default mode's segment.
	a = NewPortAllocator(PortRange{Base: 5000, Size: 100})
	b = &fakeBinder{held: map[int]error{}}
	for p := 5000; p < 5100; p++ {
		b.held[p] = inUse
	}
	if _, err := a.Open(b.listen); err == nil || len(b.tried) != maxPortTries {
		t.Errorf("Open on a range of 100 held ports: %v after %d tries, want a failure after %d", err, len(b.tried), maxPortTries)
	}
}

// The default allocator keeps out of the NodePort range given
// (--service-node-port-range), not the API server's default one: with node
// ports from 20000-22767 a proxy port could be a Service's NodePort, whose
// hold then met the proxy's own socket, while 30000-32767, where no node
// port is then allocated, was left unused.
func TestDefaultProxyPortsAvoidTheNodePortRangeGiven(t *testing.T) {
	kp, err := readKernelPortsFromProc()
	if err != nil {
		t.Skipf("cannot read the ephemeral range: %v", err)
	}
	p := newTestProxier(t, Options{NodePortRange: config.PortRange{Min: 20000, Max: 22767}})
	candidate := func(port int) bool {
		return !inAny(port, append([]PortRange{kp.Ephemeral}, kp.Reserved...))
	}
	for _, port := range []int{20000, 21000, 22767} {
		if candidate(port) && p.ports.take(port) {
			t.Errorf("port %d of the NodePort range 20000-22767 could be a proxy port", port)
		}
	}
	for _, port := range []int{30000, 31000, 32767} {
		if candidate(port) && !p.ports.take(port) {
			t.Errorf("port %d, outside the NodePort range 20000-22767, is never a proxy port", port)
		}
	}
	if p := newTestProxier(t, Options{}); candidate(30080) && p.ports.take(30080) {
		t.Error("without a NodePort range given, port 30080 of the default one could be a proxy port")
	}
}
