package proxier

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// BenchmarkKernelClearStale times the clearing of the stale entries of
// dsts UDP Service destinations (two each, tracked before their portal
// existed or NATed to a port gone, beside one live) among table unrelated
// entries, in a namespace of its own: a sync after UDP ports lost a
// destination or got a new socket, on a node whose table is full of other
// flows. path=auto is ClearStale; path=whole always dumps the whole table
// (as ClearStale did before filtered dumps, and does on kernels without
// them). cpu-ms/op is the process's user and system CPU, the kernel's walk
// of the table included.
func BenchmarkKernelClearStale(b *testing.B) {
	netns.Require(b, "ip")
	for _, table := range []int{1000, 10000, 50000} {
		ns := netns.New(b).NS("ctbench")
		if err := ns.Do(func() error { return fillConntrack(table) }); err != nil {
			b.Fatal(err)
		}
		for _, dsts := range []int{1, 4} {
			for _, path := range []string{"auto", "whole"} {
				b.Run(fmt.Sprintf("table=%d/dsts=%d/path=%s", table, dsts, path), func(b *testing.B) {
					var whole atomic.Bool
					whole.Store(path == "whole")
					if err := ns.Do(func() error { return benchClearStale(b, dsts, &whole) }); err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
}

// benchClearStale runs b's loop in the calling thread's namespace: puts
// back each of dsts destinations' stale entries, then clears them; the
// live entries must stay. With whole, the kernel is taken not to filter.
func benchClearStale(b *testing.B, dsts int, whole *atomic.Bool) error {
	const livePort = 40000
	var flows []StaleFlows
	var stale []*netlink.ConntrackFlow
	for i := range dsts {
		service := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)}), 53)
		// A client port per destination: an entry's reply tuple (to the
		// client) must be unique too.
		client := func(host byte) netip.AddrPort {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, host}), uint16(5000+i))
		}
		live := udpConntrackEntry(client(2), service, netip.MustParseAddrPort("10.200.0.1:40000"))
		if err := netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, live); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create the live entry: %w", err)
		}
		stale = append(stale,
			udpConntrackEntry(client(3), service, service),
			udpConntrackEntry(client(4), service, netip.MustParseAddrPort("10.200.0.1:41000")))
		flows = append(flows, StaleFlows{Protocol: v1.ProtocolUDP, Dst: service, Live: []int{livePort}})
	}
	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for _, f := range stale {
			if err := netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
				return fmt.Errorf("create a stale entry: %w", err)
			}
		}
		before := processCPU()
		b.StartTimer()
		if err := clearStale(kernelConntrack{}, flows, whole); err != nil {
			return err
		}
		b.StopTimer()
		cpu += processCPU() - before
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
	for _, f := range flows {
		left, err := entriesTo(unix.AF_INET, f.Dst)
		if err != nil {
			return err
		}
		if len(left) != 1 || left[0].Reverse.SrcPort != livePort {
			return fmt.Errorf("left %d entries to %v, want only the live one", len(left), f.Dst)
		}
	}
	return nil
}

// fillConntrack adds n UDP entries to unrelated destinations (198.18.0.0/16
// port 53, from distinct pod addresses) to the calling thread's namespace,
// for a ten-minute timeout.
func fillConntrack(n int) error {
	for i := range n {
		src := netip.AddrFrom4([4]byte{10, 245, byte(i >> 8), byte(i)})
		dst := netip.AddrFrom4([4]byte{198, 18, byte(i >> 12), byte(i % 7)})
		orig := netip.AddrPortFrom(dst, 53)
		f := udpConntrackEntry(netip.AddrPortFrom(src, uint16(20000+i%30000)), orig, orig)
		if err := netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
			return fmt.Errorf("create entry %d: %w", i, err)
		}
	}
	return nil
}

// udpConntrackEntry is a UDP entry from src to dst whose replies come from
// replySrc (dst itself: not NATed), for a ten-minute timeout.
func udpConntrackEntry(src, dst, replySrc netip.AddrPort) *netlink.ConntrackFlow {
	f := &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 600}
	if src.Addr().Is6() {
		f.FamilyType = unix.AF_INET6
	}
	f.Forward = netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: src.Addr().AsSlice(), SrcPort: src.Port(), DstIP: dst.Addr().AsSlice(), DstPort: dst.Port()}
	f.Reverse = netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: replySrc.Addr().AsSlice(), SrcPort: replySrc.Port(), DstIP: src.Addr().AsSlice(), DstPort: src.Port()}
	return f
}

// entriesTo lists the entries of family whose original destination is dst.
func entriesTo(family netlink.InetFamily, dst netip.AddrPort) ([]*netlink.ConntrackFlow, error) {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
	var out []*netlink.ConntrackFlow
	for _, f := range flows {
		if d, ok := netip.AddrFromSlice(f.Forward.DstIP); ok && netip.AddrPortFrom(d.Unmap(), f.Forward.DstPort) == dst {
			out = append(out, f)
		}
	}
	return out, err
}

// processCPU is the user and system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
