package proxier

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// fakeKernelPorts is a namespace's port sysctls as sessionPorts reads them.
type fakeKernelPorts struct {
	kp  kernelPorts
	err error
}

func (f *fakeKernelPorts) read() (kernelPorts, error) { return f.kp, f.err }

// fakeBinds stands in for bind(2): the ports bound, in order; held ports
// are refused with EADDRINUSE, and refuse (when set) refuses every port.
type fakeBinds struct {
	bound  []uint16
	held   map[uint16]bool
	refuse error
}

func (b *fakeBinds) bind(_ int, ep netip.AddrPort, _ int) error {
	if b.refuse != nil {
		return b.refuse
	}
	if !ep.Addr().IsUnspecified() {
		return errors.New("not the wildcard address")
	}
	if b.held[ep.Port()] {
		return unix.EADDRINUSE
	}
	b.bound = append(b.bound, ep.Port())
	return nil
}

func testSessionPorts(t *testing.T, k *fakeKernelPorts) (*sessionPorts, *fakeBinds) {
	t.Helper()
	sp := newSessionPorts(k.read, 0)
	b := &fakeBinds{held: map[uint16]bool{}}
	sp.bindTo = b.bind
	return sp, b
}

// allowedPorts is the range less its reserved ports and those held.
func allowedPorts(kp kernelPorts, held map[uint16]bool) []uint16 {
	var out []uint16
	for p := kp.Ephemeral.Base; p < kp.Ephemeral.Base+kp.Ephemeral.Size; p++ {
		if !kp.reserved(p) && !held[uint16(p)] {
			out = append(out, uint16(p))
		}
	}
	return out
}

// A session's socket is bound to a port of the ephemeral range picked at
// random (none of the reserved ones, none another socket holds), never one
// among the window ports freed last: the late answer to a closed session
// (sessionPorts) finds no other session on its port. At random, not in
// turn: ports handed out in turn from one seen could be foretold, and an
// endpoint's answer forged by an off-path sender (RFC 6056).
func TestSessionPortsHandOutRandomPortsOfTheRange(t *testing.T) {
	k := &fakeKernelPorts{kp: kernelPorts{
		Ephemeral: PortRange{Base: 40000, Size: 100},
		Reserved:  []PortRange{{Base: 40010, Size: 10}, {Base: 40050, Size: 1}},
	}}
	sp, b := testSessionPorts(t, k)
	if w := sp.window.Load(); w != 89/4 {
		t.Fatalf("window %d, want a quarter of the 89 ports not reserved (%d)", w, 89/4)
	}
	b.held[40030] = true
	allowed := allowedPorts(k.kp, b.held)
	next := func(p uint16) uint16 {
		i := slices.Index(allowed, p)
		return allowed[(i+1)%len(allowed)]
	}
	for range 3 * len(allowed) {
		if sp.bind(-1, unix.AF_INET) == 0 {
			t.Fatalf("no port bound; bound so far %v", b.bound)
		}
	}
	inTurn, seen := 0, map[uint16]bool{}
	for i, p := range b.bound {
		if !slices.Contains(allowed, p) {
			t.Fatalf("port %d bound: reserved, held or outside the range (all: %v)", p, b.bound)
		}
		if i > 0 && p == next(b.bound[i-1]) {
			inTurn++
		}
		seen[p] = true
	}
	// At random about one in 88 follows its predecessor, and 264 picks
	// see about 95 % of the ports: bounds no random run comes near.
	if inTurn > len(b.bound)/4 {
		t.Fatalf("%d of %d ports bound were the one after the port before: handed out in turn, not at random (all: %v)", inTurn, len(b.bound), b.bound)
	}
	if len(seen) < len(allowed)/2 {
		t.Fatalf("%d distinct ports of %d in %d picks (all: %v)", len(seen), len(allowed), len(b.bound), b.bound)
	}

	// The ports freed last (a window of them) are passed over.
	recent := allowed[:sp.window.Load()]
	for _, p := range recent {
		sp.noteFreed(p)
	}
	b.bound = nil
	for range 3 * len(allowed) {
		if p := sp.bind(-1, unix.AF_INET); slices.Contains(recent, p) {
			t.Fatalf("port %d bound though it was among the last %d freed", p, len(recent))
		}
	}
	if len(b.bound) == 0 {
		t.Fatal("no port bound with three quarters of the range free")
	}
	// Once window other ports were freed it is not recent any more.
	freed := recent[len(recent)-1] // freed last
	for range sp.window.Load() - 1 {
		sp.noteFreed(allowed[len(allowed)-1])
	}
	if !sp.recent(freed) {
		t.Fatalf("port %d not recent after %d frees, window %d", freed, sp.window.Load()-1, sp.window.Load())
	}
	sp.noteFreed(allowed[len(allowed)-1])
	if sp.recent(freed) {
		t.Fatalf("port %d still recent after %d frees, window %d", freed, sp.window.Load(), sp.window.Load())
	}
}

// With no port to give (the range unknown, every port offered held, bind
// refused) the socket is left unbound and the kernel picks at connect.
func TestSessionPortsLeaveTheKernelToPick(t *testing.T) {
	t.Run("range unknown", func(t *testing.T) {
		sp, b := testSessionPorts(t, &fakeKernelPorts{err: errors.New("no /proc")})
		if p := sp.bind(-1, unix.AF_INET); p != 0 || len(b.bound) != 0 {
			t.Fatalf("bound %d (%v) without a range", p, b.bound)
		}
		if sp.window.Load() != 0 {
			t.Fatalf("window %d without a range", sp.window.Load())
		}
	})
	t.Run("all held", func(t *testing.T) {
		k := &fakeKernelPorts{kp: kernelPorts{Ephemeral: PortRange{Base: 40000, Size: 100}}}
		sp, b := testSessionPorts(t, k)
		for p := range 100 {
			b.held[uint16(40000+p)] = true
		}
		if p := sp.bind(-1, unix.AF_INET); p != 0 {
			t.Fatalf("bound %d, every port is held", p)
		}
	})
	t.Run("refused", func(t *testing.T) {
		k := &fakeKernelPorts{kp: kernelPorts{Ephemeral: PortRange{Base: 40000, Size: 100}}}
		sp, b := testSessionPorts(t, k)
		b.refuse = unix.EACCES
		if p := sp.bind(-1, unix.AF_INET6); p != 0 {
			t.Fatalf("bound %d, bind refused", p)
		}
	})
	t.Run("nil", func(t *testing.T) {
		var sp *sessionPorts
		if p := sp.bind(-1, unix.AF_INET); p != 0 || sp.recentOK(1) {
			t.Fatal("a nil sessionPorts gave a port or remembers one")
		}
		sp.freed(1)
		sp.maybeReread(int64(time.Hour))
	})
}

// A change of the range or of its reserved ports reaches new sessions
// within udpPortsReread, the window with it (the window was sized once at
// start: shrunk, every port was recent and each new session opened 8
// sockets).
func TestSessionPortsFollowTheRange(t *testing.T) {
	k := &fakeKernelPorts{kp: kernelPorts{Ephemeral: PortRange{Base: 40000, Size: 100}}}
	sp, b := testSessionPorts(t, k)
	k.kp = kernelPorts{Ephemeral: PortRange{Base: 50000, Size: 10}, Reserved: []PortRange{{Base: 50004, Size: 1}}}
	sp.maybeReread(int64(udpPortsReread) - 1)
	if p := sp.bind(-1, unix.AF_INET); p < 40000 || p >= 40100 {
		t.Fatalf("port %d before the range is read again, want one of 40000-40099", p)
	}
	sp.maybeReread(int64(udpPortsReread))
	if w := sp.window.Load(); w != 9/4 {
		t.Fatalf("window %d after the range changed, want %d", w, 9/4)
	}
	b.bound = nil
	for range 20 {
		sp.bind(-1, unix.AF_INET)
	}
	for _, p := range b.bound {
		if p < 50000 || p >= 50010 || p == 50004 {
			t.Fatalf("port %d bound after the range became 50000-50009 less 50004 (all: %v)", p, b.bound)
		}
	}
	// Read again unchanged: the ports are kept as they were, not built
	// again.
	before := sp.ports.Load()
	sp.maybeReread(2 * int64(udpPortsReread))
	if sp.ports.Load() != before {
		t.Fatal("the ports were built again after an unchanged read")
	}
}

// A session's socket is bound, for real, to the port sessionPorts chose:
// the port dialUDPSession returns is the socket's, and the socket reaches
// its endpoint, in both families.
func TestDialUDPSessionBindsThePortChosen(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1"} {
		t.Run(host, func(t *testing.T) {
			pc, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
			if err != nil {
				t.Skipf("no %s: %v", host, err)
			}
			defer pc.Close()
			k := &fakeKernelPorts{kp: kernelPorts{Ephemeral: PortRange{Base: 45000, Size: 1000}}}
			sp := newSessionPorts(k.read, 0)
			fd, port, err := dialUDPSession(pc.LocalAddr().(*net.UDPAddr).AddrPort(), sp)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			if port < 45000 || port >= 46000 {
				t.Fatalf("port %d, want one of the range 45000-45999", port)
			}
			if got := localPort(fd); got != port {
				t.Fatalf("socket bound to %d, dialUDPSession says %d", got, port)
			}
			if _, err := unix.Write(fd, []byte("hi")); err != nil {
				t.Fatal(err)
			}
			_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 8)
			n, from, err := pc.ReadFrom(buf)
			if err != nil || string(buf[:n]) != "hi" {
				t.Fatalf("endpoint read %q, %v", buf[:n], err)
			}
			if got := from.(*net.UDPAddr).Port; got != int(port) {
				t.Fatalf("datagram from port %d, want %d", got, port)
			}
		})
	}
}

// When sessionPorts gives no port (bind refused; every try recent or held,
// as at the session cap) the kernel picks at connect, and a pick among the
// ports freed recently is not kept while another can be had: the socket on
// it is held while the next is opened, and the one freed longest ago is
// kept. Without that, the late reply to a closed session (sessionPorts)
// reached the client of the next session on its port. In a namespace whose
// range is two ports the kernel's picks are known: the second socket gets
// the port the first does not hold, and a third finds none.
func TestDialUDPSessionPassesOverTheKernelsRecentPick(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	netns.Require(t, "ip")
	ns := netns.New(t).NS("pick")
	ns.Sysctl("net.ipv4.ip_local_port_range", "40000 40001")
	endpoint := netip.MustParseAddrPort("127.0.0.1:9")
	for _, tc := range []struct {
		name  string
		freed []uint16 // in order: the last is the most recent
		want  uint16
	}{
		{"one recent", []uint16{40000}, 40001},
		{"the other recent", []uint16{40001}, 40000},
		{"both recent", []uint16{40000, 40001}, 40000},
		{"both recent, the other first", []uint16{40001, 40000}, 40001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &fakeKernelPorts{kp: kernelPorts{Ephemeral: PortRange{Base: 40000, Size: 100}}}
			sp, b := testSessionPorts(t, k)
			b.refuse = unix.EPERM // the kernel picks
			for _, p := range tc.freed {
				sp.noteFreed(p)
			}
			// The kernel's first pick is either port: enough tries to
			// meet both.
			err := ns.Do(func() error {
				for range 20 {
					fd, port, err := dialUDPSession(endpoint, sp)
					if err != nil {
						return err
					}
					got := localPort(fd)
					unix.Close(fd)
					if port != tc.want || got != tc.want {
						return fmt.Errorf("session socket on port %d (said %d), want %d: ports freed %v, the last most recently", got, port, tc.want, tc.freed)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
