package proxier

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
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
	// Each part is named in the error: strconv's own message said
	// `parsing "": invalid syntax` for "30000-", which named nothing.
	bad := func(format string, args ...any) error {
		return fmt.Errorf("invalid port range %q: %s (want BEGIN-END, BEGIN+N or one port)", s, fmt.Sprintf(format, args...))
	}
	number := func(part, v string) (int, error) {
		if v == "" {
			return 0, bad("%s is missing", part)
		}
		n, err := strconv.Atoi(v)
		switch {
		case err == nil && n < 0:
			return 0, bad("%s %q is negative", part, v)
		case err != nil || v[0] == '+':
			return 0, bad("%s %q is not a number", part, v)
		}
		return n, nil
	}
	var lo, hi int
	var err error
	// What the bounds are called in the error: the user's own form.
	loName, hiName := "BEGIN", "END"
	// BEGIN+N first: a "-" after the "+" is N's sign, not a range.
	if a, b, ok := strings.Cut(s, "+"); ok {
		var n int
		if lo, err = number("BEGIN", a); err == nil {
			n, err = number("N", b)
			hi = lo + n
		}
		hiName = "BEGIN+N"
	} else if a, b, ok := strings.Cut(s, "-"); ok {
		if lo, err = number("BEGIN", a); err == nil {
			hi, err = number("END", b)
		}
	} else {
		// A single port, as kube-proxy accepts it.
		lo, err = number("the port", s)
		hi = lo
		loName, hiName = "the port", "the port"
	}
	if err != nil {
		return PortRange{}, err
	}
	// Which bound is wrong, named: "ports must satisfy 1 <= BEGIN <= END
	// <= 65535" left a reversed range to be worked out.
	switch {
	case lo < 1:
		return PortRange{}, bad("%s %d is below 1", loName, lo)
	case hi > 65535:
		return PortRange{}, bad("%s %d is above 65535", hiName, hi)
	case lo > hi:
		return PortRange{}, bad("BEGIN %d is above END %d", lo, hi)
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

// PortAllocator hands out proxy ports, in one of three modes:
//   - an explicit --proxy-port-range: ports of the range, one listen try each;
//   - the default (no range): ports outside the kernel's ephemeral range
//     (see NewNodePortAllocator), skipping ports another process holds,
//     then port 0;
//   - neither (the ephemeral range unknown): always 0, the kernel chooses.
type PortAllocator struct {
	mu    sync.Mutex
	r     PortRange
	pool  []*portSegment // default mode's candidates, in order of preference
	inUse map[int]bool
	// nodePorts are the node ports of the Services served (setNodePorts),
	// which the proxy holds (NodePorts) or listens on itself
	// (healthCheckNodePorts): never handed out, in either mode.
	nodePorts map[int]bool
}

// portSegment is a run of candidate ports with how many of them we hold,
// so a full segment is skipped without a scan.
type portSegment struct {
	lo, hi int // bounds of the run; ports holds its candidates
	ports  []uint16
	used   int
}

func NewPortAllocator(r PortRange) *PortAllocator {
	return &PortAllocator{r: r, inUse: map[int]bool{}}
}

// wellKnownNodePorts are ports below the ephemeral range that node daemons
// listen on (and may start after us): holding one of them for a proxy
// socket would keep that daemon from starting.
var wellKnownNodePorts = []PortRange{
	{Base: 2379, Size: 2},   // etcd client and peer
	{Base: 4240, Size: 1},   // Cilium health
	{Base: 4789, Size: 1},   // VXLAN (in-kernel UDP socket)
	{Base: 6081, Size: 1},   // Geneve (in-kernel UDP socket)
	{Base: 6443, Size: 1},   // kube-apiserver
	{Base: 8472, Size: 1},   // flannel/Cilium VXLAN
	{Base: 9099, Size: 1},   // Calico felix health
	{Base: 9100, Size: 1},   // node-exporter
	{Base: 10248, Size: 12}, // kubelet, kube-proxy, controller-manager, scheduler: 10248-10259
}

// NewNodePortAllocator is the default mode: proxy ports come from outside
// the kernel's ephemeral range, so a proxy port can never be the source port
// of one of the node's own connections (whose replies the guard of a
// stopped proxy would otherwise meet), and listening on 10,000 ports does
// not make the kernel search its ephemeral range for every bind(0). Ports
// above the range come first (nothing well known lives there), then ports
// from 1024 up to the range; avoid (the NodePort range), the kernel's
// reserved ports and wellKnownNodePorts are never handed out.
func NewNodePortAllocator(kp kernelPorts, avoid ...PortRange) *PortAllocator {
	a := NewPortAllocator(PortRange{})
	eph := kp.Ephemeral
	skip := append(append(append([]PortRange{eph}, avoid...), kp.Reserved...), wellKnownNodePorts...)
	for _, run := range [][2]int{{eph.Base + eph.Size, 65535}, {1024, eph.Base - 1}} {
		seg := &portSegment{lo: run[0], hi: run[1]}
		for port := run[0]; port <= run[1]; port++ {
			if !inAny(port, skip) {
				seg.ports = append(seg.ports, uint16(port))
			}
		}
		if len(seg.ports) > 0 {
			a.pool = append(a.pool, seg)
		}
	}
	return a
}

func inAny(port int, rs []PortRange) bool {
	for _, r := range rs {
		if port >= r.Base && port < r.Base+r.Size {
			return true
		}
	}
	return false
}

// AllocateNext returns a port to listen on; 0 asks the kernel. It tries a
// random port first (so restarts do not collide with ports still in
// TIME_WAIT from the previous process), then scans.
func (a *PortAllocator) AllocateNext() (int, error) {
	return a.allocateFrom(0)
}

// allocateFrom is AllocateNext that, in the default mode, takes nothing
// from the pool's first skip segments.
func (a *PortAllocator) allocateFrom(skip int) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.r.Size == 0 {
		return a.nextFromPool(skip), nil
	}
	start := rand.IntN(a.r.Size)
	for i := 0; i < a.r.Size; i++ {
		p := a.r.Base + (start+i)%a.r.Size
		if !a.inUse[p] && !a.nodePorts[p] {
			a.inUse[p] = true
			return p, nil
		}
	}
	return 0, a.exhausted()
}

// exhausted is ErrPortRangeExhausted with what to act on: the range,
// what holds its ports, and that the flag is to widen. Its bare words,
// logged for each service port at each sync, named neither.
func (a *PortAllocator) exhausted() error {
	return fmt.Errorf("%w: --proxy-port-range %s: %s; widen it (each service port takes one)", ErrPortRangeExhausted, a.r, a.heldBy())
}

// heldBy says what holds the explicit range's ports, in words that agree
// with their count: a one-port range is common in tests and examples.
func (a *PortAllocator) heldBy() string {
	const nodePort = "a node port of a Service, which no proxy socket takes"
	const nodePorts = "node ports of Services, which no proxy socket takes"
	n, size := a.nodePortsInRange(), a.r.Size
	switch {
	case size == 1 && n == 0:
		return "its one port holds a proxy socket"
	case size == 1:
		return "its one port is " + nodePort
	case n == 0:
		return fmt.Sprintf("each of its %d ports holds a proxy socket", size)
	case n == size:
		return fmt.Sprintf("each of its %d ports is %s", size, nodePort)
	case n == 1:
		return fmt.Sprintf("1 of its %d ports is %s, and each other holds a proxy socket", size, nodePort)
	default:
		return fmt.Sprintf("%d of its %d ports are %s, and each other holds a proxy socket", n, size, nodePorts)
	}
}

// nodePortsInRange counts the node ports in the explicit range.
func (a *PortAllocator) nodePortsInRange() int {
	n := 0
	for p := range a.nodePorts {
		if p >= a.r.Base && p < a.r.Base+a.r.Size {
			n++
		}
	}
	return n
}

// nextFromPool takes a free candidate of the segments after the first
// skip, or 0 when all are held (or there are none): the kernel then
// chooses, from its ephemeral range.
func (a *PortAllocator) nextFromPool(skip int) int {
	for i, s := range a.pool {
		if i < skip || s.used == len(s.ports) {
			continue
		}
		start := rand.IntN(len(s.ports))
		for i := range s.ports {
			p := int(s.ports[(start+i)%len(s.ports)])
			if !a.inUse[p] && !a.nodePorts[p] {
				a.inUse[p] = true
				s.used++
				return p
			}
		}
	}
	return 0
}

// setNodePorts makes ports the node ports no proxy socket is given, and
// reports whether they differ from the last ones. Ports handed out before
// stay out: the caller moves those that are node ports now (isNodePort).
func (a *PortAllocator) setNodePorts(ports map[int]bool) (changed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	changed = !maps.Equal(a.nodePorts, ports)
	a.nodePorts = ports
	return changed
}

// isNodePort reports whether port is one of the node ports (setNodePorts).
func (a *PortAllocator) isNodePort(port int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nodePorts[port]
}

// hasFree reports whether n more ports can be handed out: in an explicit
// range, n of its ports are neither handed out nor node ports; the
// default mode always has one (the kernel chooses when its pool is spent).
func (a *PortAllocator) hasFree(n int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.r.Size == 0 {
		return true
	}
	for p := a.r.Base; p < a.r.Base+a.r.Size && n > 0; p++ {
		if !a.inUse[p] && !a.nodePorts[p] {
			n--
		}
	}
	return n == 0
}

// handedOut reports whether port is held by one of our proxy sockets.
func (a *PortAllocator) handedOut(port int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inUse[port]
}

// Release returns a port; ports not handed out (kernel-chosen) are ignored.
func (a *PortAllocator) Release(port int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.inUse[port] {
		return
	}
	delete(a.inUse, port)
	for _, s := range a.pool {
		if port >= s.lo && port <= s.hi {
			s.used--
		}
	}
}

// maxPortTries bounds how many ports held by other processes the default
// mode skips in one segment of its pool before it moves to the next one,
// and the kernel chooses once every segment has had its tries.
const maxPortTries = 16

// Open listens on the next port. In the default mode a port another
// process holds (EADDRINUSE, EACCES) is skipped for the next one; after
// maxPortTries in a segment the next segment is tried (the ports above the
// ephemeral range may be crowded by other listeners while those below it
// are free), and after the last the kernel chooses. With an explicit range
// such a port is skipped too, for another free port of the range, up to
// maxPortTries of them; when none is left the last listen's error is
// returned (the next sync retries). It failed at once before, and the
// port, released, was handed to the next service port of the same sync.
func (a *PortAllocator) Open(listen func(port int) (proxySocket, error)) (proxySocket, error) {
	// Ports others hold stay marked until Open returns, so one Open does
	// not try them twice.
	var held []int
	defer func() {
		for _, p := range held {
			a.Release(p)
		}
	}()
	skip, triesInSegment := 0, 0
	var heldErr error // the last listen on a port another process holds
	for {
		port, err := a.allocateFrom(skip)
		if err != nil {
			if heldErr != nil && errors.Is(err, ErrPortRangeExhausted) {
				return nil, heldErr // the free ports are all someone else's
			}
			return nil, err
		}
		if port == 0 && len(held) > 0 {
			break // every candidate is ours or someone else's
		}
		sock, err := listen(port)
		if err == nil {
			return sock, nil
		}
		retry := port != 0 && (errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES))
		if !retry {
			a.Release(port)
			if errors.Is(err, ErrPortRangeExhausted) {
				return nil, err // not about this port
			}
			return nil, fmt.Errorf("listen on port %d: %w", port, err)
		}
		held = append(held, port)
		if a.r.Size != 0 {
			heldErr = fmt.Errorf("listen on port %d: %w", port, err)
			if len(held) >= maxPortTries {
				return nil, heldErr
			}
			continue
		}
		if triesInSegment++; triesInSegment >= maxPortTries {
			if skip, triesInSegment = a.segmentAfter(port), 0; skip >= len(a.pool) {
				break
			}
		}
	}
	sock, err := listen(0)
	if err != nil {
		return nil, fmt.Errorf("listen on a kernel-chosen port: %w", err)
	}
	return sock, nil
}

// Reserve takes, of ports, each one the allocator would hand out and no
// one of ours holds, and returns those it took: during a restart's first
// sync no other service port may be given a port the kernel's rules still
// send some Service's traffic to. OpenPreferred opens one; Release gives
// back one never opened.
func (a *PortAllocator) Reserve(ports []int) map[int]bool {
	out := map[int]bool{}
	for _, port := range ports {
		if port > 0 && port <= 65535 && a.take(port) {
			out[port] = true
		}
	}
	return out
}

// OpenPreferred listens on reserved, a port Reserve took for the caller,
// or is Open when reserved is 0. When that listen fails (another process
// holds the port now) the port is released and Open picks another.
func (a *PortAllocator) OpenPreferred(reserved int, listen func(port int) (proxySocket, error)) (proxySocket, error) {
	if reserved <= 0 {
		return a.Open(listen)
	}
	if sock, err := listen(reserved); err == nil {
		return sock, nil
	}
	a.Release(reserved)
	return a.Open(listen)
}

// take marks port as ours if it is a free candidate: in the explicit range,
// or in the default mode's pool (never with ports left to the kernel), and
// not a node port.
func (a *PortAllocator) take(port int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inUse[port] || a.nodePorts[port] {
		return false
	}
	if a.r.Size > 0 {
		if port < a.r.Base || port >= a.r.Base+a.r.Size {
			return false
		}
		a.inUse[port] = true
		return true
	}
	for _, s := range a.pool {
		if port >= s.lo && port <= s.hi {
			if _, found := slices.BinarySearch(s.ports, uint16(port)); !found {
				return false
			}
			a.inUse[port] = true
			s.used++
			return true
		}
	}
	return false
}

// segmentAfter is the index of the pool segment that follows port's.
func (a *PortAllocator) segmentAfter(port int) int {
	for i, s := range a.pool {
		if port >= s.lo && port <= s.hi {
			return i + 1
		}
	}
	return len(a.pool)
}

// newPortAllocator is the proxier's: the explicit range if there is one,
// else ports outside this namespace's ephemeral range and the NodePort
// range np (zero: the API server's default), else whatever the kernel
// chooses.
func newPortAllocator(r PortRange, np config.PortRange) *PortAllocator {
	if r.Size > 0 {
		return NewPortAllocator(r)
	}
	kp, err := readKernelPortsFromProc()
	if err != nil {
		klog.InfoS("Proxy ports are kernel-chosen: cannot read the ephemeral port range", "err", err)
		return NewPortAllocator(r)
	}
	if np == (config.PortRange{}) {
		np = config.DefaultNodePortRange
	}
	return NewNodePortAllocator(kp, PortRange{Base: int(np.Min), Size: int(np.Max-np.Min) + 1})
}
