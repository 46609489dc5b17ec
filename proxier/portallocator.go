package proxier

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
)

// PortRange is an inclusive range of local ports for proxy sockets.
type PortRange struct {
	Base, Size int
}

// ParsePortRange accepts kube-proxy's forms "BEGIN-END" and "BEGIN+N"; the
// empty string means "let the kernel choose" and yields a zero range.
func ParsePortRange(s string) (PortRange, error) {
	s = strings.TrimSpace(s)
	// kube-proxy's meaning: empty, "0" and "0-0" leave ports to the kernel.
	if s == "" || s == "0" || s == "0-0" {
		return PortRange{}, nil
	}
	var lo, hi int
	var err error
	switch {
	case strings.Contains(s, "-"):
		a, b, _ := strings.Cut(s, "-")
		if lo, err = strconv.Atoi(a); err == nil {
			hi, err = strconv.Atoi(b)
		}
	case strings.Contains(s, "+"):
		a, b, _ := strings.Cut(s, "+")
		var n int
		if lo, err = strconv.Atoi(a); err == nil {
			n, err = strconv.Atoi(b)
			hi = lo + n
		}
	default:
		// A single port, as kube-proxy accepts it.
		if lo, err = strconv.Atoi(s); err != nil {
			return PortRange{}, fmt.Errorf("invalid port range %q: want BEGIN-END, BEGIN+N or one port", s)
		}
		hi = lo
	}
	if err != nil {
		return PortRange{}, fmt.Errorf("invalid port range %q: %v", s, err)
	}
	if lo < 1 || hi > 65535 || lo > hi {
		return PortRange{}, fmt.Errorf("invalid port range %q: ports must satisfy 1 <= BEGIN <= END <= 65535", s)
	}
	return PortRange{Base: lo, Size: hi - lo + 1}, nil
}

func (r PortRange) String() string {
	if r.Size == 0 {
		return ""
	}
	return fmt.Sprintf("%d-%d", r.Base, r.Base+r.Size-1)
}

// ErrPortRangeExhausted means every port of --proxy-port-range is taken.
var ErrPortRangeExhausted = errors.New("proxy port range exhausted")

// PortAllocator hands out proxy ports. With an empty range it always returns
// 0, which asks the kernel for a free port at listen time.
type PortAllocator struct {
	mu    sync.Mutex
	r     PortRange
	inUse map[int]bool
}

func NewPortAllocator(r PortRange) *PortAllocator {
	return &PortAllocator{r: r, inUse: map[int]bool{}}
}

// AllocateNext tries a random port first (so restarts do not collide with
// ports still in TIME_WAIT from the previous process), then scans.
func (a *PortAllocator) AllocateNext() (int, error) {
	if a.r.Size == 0 {
		return 0, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	start := rand.IntN(a.r.Size)
	for i := 0; i < a.r.Size; i++ {
		p := a.r.Base + (start+i)%a.r.Size
		if !a.inUse[p] {
			a.inUse[p] = true
			return p, nil
		}
	}
	return 0, ErrPortRangeExhausted
}

// Release returns a port to the range; ports outside it (kernel-chosen) are ignored.
func (a *PortAllocator) Release(port int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.inUse, port)
}
