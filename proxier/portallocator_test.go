package proxier

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParsePortRange(t *testing.T) {
	tests := []struct {
		in      string
		want    PortRange
		wantErr bool
	}{
		{"", PortRange{}, false},
		{"30000-30009", PortRange{Base: 30000, Size: 10}, false},
		{"30000+9", PortRange{Base: 30000, Size: 10}, false},
		{"5-5", PortRange{Base: 5, Size: 1}, false},
		{"10-5", PortRange{}, true},
		{"0-10", PortRange{}, true},
		{"1-70000", PortRange{}, true},
		{"abc", PortRange{}, true},
		{"1-x", PortRange{}, true},
		// kube-proxy's meanings: 0 and 0-0 are kernel-chosen; one port is a range of one.
		{"0", PortRange{}, false},
		{"0-0", PortRange{}, false},
		{"30000", PortRange{Base: 30000, Size: 1}, false},
		{"70000", PortRange{}, true},
	}
	for _, tt := range tests {
		got, err := ParsePortRange(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParsePortRange(%q) = %+v, %v; want %+v, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// A malformed range says which part is wrong: "30000-" printed strconv's
// `parsing "": invalid syntax`, naming nothing.
func TestParsePortRangeSaysWhatIsWrong(t *testing.T) {
	for in, want := range map[string]string{
		"30000-":   "END is missing",
		"-30000":   "BEGIN is missing",
		"30000+":   "N is missing",
		"30000+-5": `N "-5" is negative`,
		"30000-x":  `END "x" is not a number`,
		"x+5":      `BEGIN "x" is not a number`,
		"abc":      `the port "abc" is not a number`,
		"1-2-3":    `END "2-3" is not a number`,
		// Out of order or out of bounds: which bound, not only the rule
		// "ports must satisfy 1 <= BEGIN <= END <= 65535".
		"40010-40000": "BEGIN 40010 is above END 40000",
		"0-10":        "BEGIN 0 is below 1",
		"1-70000":     "END 70000 is above 65535",
		"65000+1000":  "BEGIN+N 66000 is above 65535",
		"70000":       "the port 70000 is above 65535",
	} {
		_, err := ParsePortRange(in)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "strconv") {
			t.Errorf("ParsePortRange(%q): %v; want an error saying %s", in, err, want)
		}
	}
}

func TestPortAllocator(t *testing.T) {
	a := NewPortAllocator(PortRange{Base: 40000, Size: 3})
	seen := map[int]bool{}
	for range 3 {
		p, err := a.AllocateNext()
		if err != nil || p < 40000 || p > 40002 || seen[p] {
			t.Fatalf("AllocateNext = %d, %v (seen %v)", p, err, seen)
		}
		seen[p] = true
	}
	// The error names the flag and its range and says what to do: it
	// said only "proxy port range exhausted", for every port at every sync.
	if _, err := a.AllocateNext(); !errors.Is(err, ErrPortRangeExhausted) || !strings.Contains(err.Error(), "--proxy-port-range 40000-40002") || !strings.Contains(err.Error(), "widen it") {
		t.Fatalf("full range: err %v, want ErrPortRangeExhausted naming --proxy-port-range 40000-40002 and saying to widen it", err)
	}
	a.Release(40001)
	if p, err := a.AllocateNext(); err != nil || p != 40001 {
		t.Fatalf("after release got %d, %v; want 40001", p, err)
	}
	if p, _ := NewPortAllocator(PortRange{}).AllocateNext(); p != 0 {
		t.Fatalf("empty range gave %d, want 0 (kernel-chosen)", p)
	}
}

// The exhausted range's message agrees in number with its ports: a
// one-port range said "each of its 1 ports holds a proxy socket".
func TestPortRangeExhaustedWording(t *testing.T) {
	for _, tc := range []struct {
		size      int
		nodePorts []int
		want      string
	}{
		{1, nil, "--proxy-port-range 40100-40100: its one port holds a proxy socket; widen it"},
		{1, []int{40100}, "--proxy-port-range 40100-40100: its one port is a node port of a Service, which no proxy socket takes; widen it"},
		{3, nil, "--proxy-port-range 40100-40102: each of its 3 ports holds a proxy socket; widen it"},
		{3, []int{40101}, "--proxy-port-range 40100-40102: 1 of its 3 ports is a node port of a Service, which no proxy socket takes, and each other holds a proxy socket; widen it"},
		{3, []int{40100, 40101}, "--proxy-port-range 40100-40102: 2 of its 3 ports are node ports of Services, which no proxy socket takes, and each other holds a proxy socket; widen it"},
		{2, []int{40100, 40101}, "--proxy-port-range 40100-40101: each of its 2 ports is a node port of a Service, which no proxy socket takes; widen it"},
	} {
		a := NewPortAllocator(PortRange{Base: 40100, Size: tc.size})
		nodePorts := map[int]bool{}
		for _, p := range tc.nodePorts {
			nodePorts[p] = true
		}
		a.setNodePorts(nodePorts)
		var err error
		for range tc.size + 1 {
			if _, err = a.AllocateNext(); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrPortRangeExhausted) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("size %d, node ports %v: err %v, want it to say %q", tc.size, tc.nodePorts, err, tc.want)
		}
	}
}

// A range port whose listen fails is released and the service port is
// retried on the next sync.
func TestFailedListenReleasesRangePort(t *testing.T) {
	// Occupy the only port of the range.
	blocker := startBackends(t, "127.0.0.1")
	port, _ := strconv.Atoi(portOf(blocker[0].ln.Addr()))
	p := newTestProxier(t, Options{PortRange: PortRange{Base: port, Size: 1}})
	p.OnServiceAdd(makeService("web"))
	p.Sync()
	if _, ok := p.ProxyPort("default/web:p"); ok {
		t.Fatal("service port listed although its listen must have failed")
	}
	blocker[0].ln.Close()
	p.Sync()
	if got, ok := p.ProxyPort("default/web:p"); !ok || got != port {
		t.Fatalf("after the port freed up: port %d ok=%v, want %d", got, ok, port)
	}
}

// The allocator hands out no node port of a Service served (setNodePorts),
// in either mode, nor reserves one for a restart: its NodePort hold would
// meet the proxy's own socket. With --proxy-port-range 30078-30082 over
// NodePort 30080, a proxy socket took 30080 and the hold failed forever.
func TestPortAllocatorSkipsNodePorts(t *testing.T) {
	a := NewPortAllocator(PortRange{Base: 30078, Size: 5})
	a.setNodePorts(map[int]bool{30080: true, 40000: true})
	var got []int
	for range 4 {
		p, err := a.AllocateNext()
		if err != nil {
			t.Fatalf("AllocateNext after %v: %v", got, err)
		}
		got = append(got, p)
	}
	if slices.Contains(got, 30080) {
		t.Errorf("explicit range handed out NodePort 30080: %v", got)
	}
	if _, err := a.AllocateNext(); !errors.Is(err, ErrPortRangeExhausted) || !strings.Contains(err.Error(), "1 of its 5 ports is a node port") {
		t.Errorf("the range's other ports all taken: err %v, want ErrPortRangeExhausted saying 1 of its 5 ports is a node port", err)
	}
	if r := NewPortAllocator(PortRange{Base: 30078, Size: 5}); len(r.Reserve([]int{30079, 30080})) != 2 {
		t.Fatal("Reserve refused free ports of the range")
	}
	r := NewPortAllocator(PortRange{Base: 30078, Size: 5})
	r.setNodePorts(map[int]bool{30080: true})
	if kept := r.Reserve([]int{30079, 30080}); !kept[30079] || kept[30080] {
		t.Errorf("Reserve took %v of 30079 and NodePort 30080, want 30079 only", kept)
	}

	// The default mode: a pool of 65532-65535 above the ephemeral range.
	pool := NewNodePortAllocator(kernelPorts{Ephemeral: PortRange{Base: 1024, Size: 65532 - 1024}})
	pool.setNodePorts(map[int]bool{65533: true})
	if got := allocateAll(t, pool); len(got) != 3 || slices.Contains(got, 65533) {
		t.Errorf("pool handed out %v, want 65532, 65534 and 65535", got)
	}
	// Node ports no longer served are handed out again.
	pool.setNodePorts(nil)
	if p, _ := pool.AllocateNext(); p != 65533 {
		t.Errorf("after its Service went, 65533 is not handed out (got %d)", p)
	}
}
