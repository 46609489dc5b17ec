package proxier

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// fakeTable is a conntrack table whose kernel filters dumps (filters) or
// ignores their filter (a kernel before 5.8), or refuses them (refuse).
type fakeTable struct {
	entries  []conntrackEntry
	filters  bool
	refuse   error
	buckets  int
	count    int // entries size reports, when not those in entries
	sizeErr  error
	dumps    []string // the filters of the dumps asked for: family, address, port
	wholeRun int      // dumps of the whole table
}

// add puts an entry in the table: proto from src to dst, whose replies come
// from replySrc (dst: not NATed).
func (f *fakeTable) add(proto uint8, src, dst, replySrc string) {
	s, d, r := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst), netip.MustParseAddrPort(replySrc)
	e := conntrackEntry{msg: []byte(fmt.Sprintf("%d %v %v %v", proto, s, d, r))}
	e.flow.Forward = netlink.IPTuple{Protocol: proto, SrcIP: s.Addr().AsSlice(), SrcPort: s.Port(), DstIP: d.Addr().AsSlice(), DstPort: d.Port()}
	e.flow.Reverse = netlink.IPTuple{Protocol: proto, SrcIP: r.Addr().AsSlice(), SrcPort: r.Port(), DstIP: s.Addr().AsSlice(), DstPort: s.Port()}
	if proto == unix.IPPROTO_TCP {
		e.flow.ProtoInfo = &netlink.ProtoInfoTCP{State: nl.TCP_CONNTRACK_ESTABLISHED}
	}
	f.entries = append(f.entries, e)
}

// left is what stays in the table, in the form add was given it.
func (f *fakeTable) left() []string {
	var out []string
	for _, e := range f.entries {
		out = append(out, string(e.msg))
	}
	slices.Sort(out)
	return out
}

func familyOf(flow *netlink.ConntrackFlow) netlink.InetFamily {
	if len(flow.Forward.DstIP) == 4 {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func (f *fakeTable) dumpTo(family netlink.InetFamily, key staleKey) ([]conntrackEntry, error) {
	f.dumps = append(f.dumps, fmt.Sprintf("%d %v %d", family, key.dst.Addr(), key.dst.Port()))
	if f.refuse != nil {
		return nil, f.refuse
	}
	var out []conntrackEntry
	for _, e := range f.entries {
		if familyOf(&e.flow) == family && (!f.filters || key.holds(&e.flow)) {
			out = append(out, e)
		}
	}
	return out, nil
}

func (f *fakeTable) delete(_ netlink.InetFamily, e conntrackEntry) error {
	for i, have := range f.entries {
		if string(have.msg) == string(e.msg) {
			f.entries = slices.Delete(f.entries, i, i+1)
			return nil
		}
	}
	return unix.ENOENT
}

func (f *fakeTable) clearAll(family netlink.InetFamily, set staleSet) error {
	f.wholeRun++
	f.entries = slices.DeleteFunc(f.entries, func(e conntrackEntry) bool {
		return familyOf(&e.flow) == family && set.MatchConntrackFlow(&e.flow)
	})
	return nil
}

func (f *fakeTable) size() (int, int, error) {
	if f.count != 0 {
		return f.count, f.buckets, f.sizeErr
	}
	return len(f.entries), f.buckets, f.sizeErr
}

// staleFixture is a table with stale entries of a UDP ClusterIP (IPv4 and
// IPv6) and NodePort, beside live and unrelated ones, the flows that name
// them, and what must be left once they are cleared.
func staleFixture() (*fakeTable, []StaleFlows, []string) {
	t := &fakeTable{filters: true, buckets: 262144}
	udp, tcp := uint8(unix.IPPROTO_UDP), uint8(unix.IPPROTO_TCP)
	kept := func(proto uint8, src, dst, replySrc string) string {
		t.add(proto, src, dst, replySrc)
		return string(t.entries[len(t.entries)-1].msg)
	}
	left := []string{
		kept(udp, "10.244.0.2:5000", "10.96.0.10:53", "10.200.0.1:40000"),    // live
		kept(udp, "10.244.0.3:5000", "10.96.0.11:53", "10.96.0.11:53"),       // another service IP
		kept(udp, "10.244.0.3:5001", "10.96.0.10:54", "10.96.0.10:54"),       // another port
		kept(tcp, "10.244.0.3:5002", "10.96.0.10:53", "10.96.0.10:53"),       // TCP
		kept(udp, "[fd00::2]:5000", "[fd00::10]:53", "[fd00::1]:40000"),      // live, IPv6
		kept(udp, "[fd00::3]:5000", "[fd00::11]:53", "[fd00::11]:53"),        // another IPv6 service IP, same port
		kept(udp, "10.244.0.5:5000", "10.200.0.1:30053", "10.200.0.1:40000"), // NodePort, live
	}
	for i := range 100 {
		left = append(left, kept(udp, fmt.Sprintf("10.245.0.%d:6000", i), "198.18.0.1:53", "198.18.0.1:53"))
	}
	t.add(udp, "10.244.0.3:5003", "10.96.0.10:53", "10.96.0.10:53")       // before the portal
	t.add(udp, "10.244.0.4:5000", "10.96.0.10:53", "10.200.0.1:41000")    // to a port gone
	t.add(udp, "[fd00::3]:5001", "[fd00::10]:53", "[fd00::10]:53")        // IPv6, before the portal
	t.add(udp, "10.244.0.6:5000", "10.200.0.1:30053", "10.200.0.1:30053") // NodePort, before the portal
	flows := []StaleFlows{
		{Protocol: v1.ProtocolUDP, Dst: netip.MustParseAddrPort("10.96.0.10:53"), Live: []int{40000}},
		{Protocol: v1.ProtocolUDP, Dst: netip.MustParseAddrPort("[fd00::10]:53"), Live: []int{40000}},
		{Protocol: v1.ProtocolUDP, Dst: netip.AddrPortFrom(netip.Addr{}, 30053), Live: []int{40000}},
	}
	slices.Sort(left)
	return t, flows, left
}

// A kernel that filters dumps gets one per destination, not a dump of the
// whole table: IPv6 ones by port (the kernel's IPv6 address filter is
// inverted) and a NodePort by port, their other entries matched here.
func TestClearStaleDumpsOnlyTheDestinations(t *testing.T) {
	table, flows, left := staleFixture()
	table.count = 1_000_000 // a busy node: a walk per destination is cheaper
	var ignores atomic.Bool
	if err := clearStale(table, flows, &ignores); err != nil {
		t.Fatal(err)
	}
	if got := table.left(); !slices.Equal(got, left) {
		t.Errorf("left %q, want %q", got, left)
	}
	if table.wholeRun != 0 || ignores.Load() {
		t.Errorf("%d dumps of the whole table (the kernel taken to ignore filters: %v), want none", table.wholeRun, ignores.Load())
	}
	want := []string{
		fmt.Sprintf("%d 10.96.0.10 53", unix.AF_INET),
		fmt.Sprintf("%d invalid IP 30053", unix.AF_INET),
		fmt.Sprintf("%d invalid IP 53", unix.AF_INET6),
		fmt.Sprintf("%d invalid IP 30053", unix.AF_INET6),
	}
	slices.Sort(want)
	slices.Sort(table.dumps)
	if !slices.Equal(table.dumps, want) {
		t.Errorf("dumps filtered by %q, want %q", table.dumps, want)
	}
}

// A kernel that refuses the filter (EOPNOTSUPP, EINVAL) gets one dump of
// the whole table, and no filtered one from then on.
func TestClearStaleFallsBackWhenTheKernelRefusesTheFilter(t *testing.T) {
	for _, refused := range []error{unix.EOPNOTSUPP, unix.EINVAL} {
		t.Run(refused.Error(), func(t *testing.T) {
			table, flows, left := staleFixture()
			table.count = 1_000_000 // where dumps per destination are cheaper
			table.refuse = refused
			var ignores atomic.Bool
			if err := clearStale(table, flows[:1], &ignores); err != nil {
				t.Fatal(err)
			}
			if !ignores.Load() || table.wholeRun != 1 {
				t.Fatalf("refused: kernel taken to ignore filters %v, %d dumps of the whole table; want true, 1", ignores.Load(), table.wholeRun)
			}
			dumps := len(table.dumps)
			if err := clearStale(table, flows, &ignores); err != nil {
				t.Fatal(err)
			}
			if len(table.dumps) != dumps || table.wholeRun != 3 {
				t.Errorf("after a refusal: %d more filtered dumps and %d dumps of the whole table, want 0 and 3 (one per family)", len(table.dumps)-dumps, table.wholeRun)
			}
			if got := table.left(); !slices.Equal(got, left) {
				t.Errorf("left %q, want %q", got, left)
			}
		})
	}
}

// Any other error is the clearing's, with no fallback.
func TestClearStaleReportsOtherDumpErrors(t *testing.T) {
	table, flows, _ := staleFixture()
	table.refuse = unix.ENOBUFS
	var ignores atomic.Bool
	if err := clearStale(table, flows[:1], &ignores); !errors.Is(err, unix.ENOBUFS) {
		t.Errorf("err %v, want ENOBUFS", err)
	}
	if ignores.Load() || table.wholeRun != 0 {
		t.Errorf("kernel taken to ignore filters %v, %d dumps of the whole table; want false, 0", ignores.Load(), table.wholeRun)
	}
}

// A kernel that ignores the filter (before Linux 5.8) answers the first
// dump with the whole table: it is matched against every destination,
// and no more filtered dumps are asked for.
func TestClearStaleWhenTheKernelIgnoresTheFilter(t *testing.T) {
	table, flows, left := staleFixture()
	table.count = 1_000_000 // where dumps per destination are cheaper
	table.filters = false
	var ignores atomic.Bool
	if err := clearStale(table, flows[:1], &ignores); err != nil {
		t.Fatal(err)
	}
	if !ignores.Load() || len(table.dumps) != 1 || table.wholeRun != 0 {
		t.Fatalf("kernel taken to ignore filters %v after %d filtered dumps and %d of the whole table; want true, 1, 0", ignores.Load(), len(table.dumps), table.wholeRun)
	}
	if err := clearStale(table, flows, &ignores); err != nil {
		t.Fatal(err)
	}
	if len(table.dumps) != 1 || table.wholeRun != 2 {
		t.Errorf("then %d filtered dumps and %d of the whole table, want 1 and 2", len(table.dumps), table.wholeRun)
	}
	if got := table.left(); !slices.Equal(got, left) {
		t.Errorf("left %q, want %q", got, left)
	}
}

// Dumps per destination only while their walks of the hash cost less than
// parsing the whole table.
func TestFilteredDumpsOnlyWhileCheaper(t *testing.T) {
	for _, tc := range []struct {
		dsts, entries, buckets int
		sizeErr                error
		filtered               bool
	}{
		{1, 1_000_000, 262144, nil, true},
		{1, 0, 262144, errors.New("no /proc"), true},
		{2, 1000, 262144, nil, false},
		{2, 11_000, 262144, nil, true}, // the soak's node
		{4, 11_000, 262144, nil, false},
		{4, 50_000, 262144, nil, true},
		{16, 250_000, 262144, nil, true},
		{24, 250_000, 262144, nil, false},
		{2, 1_000_000, 262144, errors.New("no /proc"), false},
	} {
		table := &fakeTable{count: tc.entries, buckets: tc.buckets, sizeErr: tc.sizeErr}
		if got := filteredDumps(table, tc.dsts); got != tc.filtered {
			t.Errorf("%d destinations, %d entries, %d buckets, size error %v: filtered %v, want %v", tc.dsts, tc.entries, tc.buckets, tc.sizeErr, got, tc.filtered)
		}
	}
}

// TestKernelFilteredClearing, in namespaces of their own: a clearing with
// dumps the kernel filters deletes the entries that a dump of the whole
// table deletes: the stale UDP entries of a ClusterIP, an external IP and a
// NodePort, IPv4 and IPv6, and the TCP ones un-NATed or reset to a port
// gone; the live and unrelated ones stay (an IPv6 one to another address
// on the same port among them: the kernel's filter by IPv6 address lists
// only those). And the fields read out of the filtered dumps are netlink's.
func TestKernelFilteredClearing(t *testing.T) {
	netns.Require(t, "ip")
	const (
		closed      = nl.TCP_CONNTRACK_CLOSE
		established = nl.TCP_CONNTRACK_ESTABLISHED
		synSent     = nl.TCP_CONNTRACK_SYN_SENT
	)
	type entry struct {
		proto              uint8
		src, dst, replySrc string
		state              uint8 // TCP
		stale              bool
	}
	entries := []entry{
		{unix.IPPROTO_UDP, "10.244.0.3:5000", "10.96.0.10:53", "10.96.0.10:53", 0, true},
		{unix.IPPROTO_UDP, "10.244.0.4:5000", "10.96.0.10:53", "10.200.0.1:41000", 0, true},
		{unix.IPPROTO_UDP, "10.244.0.2:5000", "10.96.0.10:53", "10.200.0.1:40000", 0, false},
		{unix.IPPROTO_UDP, "10.244.0.3:5001", "10.96.0.11:53", "10.96.0.11:53", 0, false},
		{unix.IPPROTO_UDP, "10.244.0.3:5002", "10.96.0.10:54", "10.96.0.10:54", 0, false},
		{unix.IPPROTO_UDP, "198.51.100.7:6000", "203.0.113.10:53", "10.200.0.1:40000", 0, true},
		{unix.IPPROTO_UDP, "198.51.100.7:6001", "203.0.113.10:53", "10.200.0.1:40001", 0, false},
		{unix.IPPROTO_UDP, "198.51.100.7:6002", "10.200.0.1:30053", "10.200.0.1:30053", 0, true},
		{unix.IPPROTO_UDP, "198.51.100.7:6003", "10.200.0.1:30053", "10.200.0.1:40000", 0, false},
		{unix.IPPROTO_TCP, "10.244.0.3:7000", "10.96.0.20:80", "10.200.0.1:41002", closed, true},
		{unix.IPPROTO_TCP, "10.244.0.3:7001", "10.96.0.20:80", "10.200.0.1:41002", established, false},
		{unix.IPPROTO_TCP, "10.244.0.3:7002", "10.96.0.20:80", "10.96.0.20:80", synSent, true},
		{unix.IPPROTO_UDP, "[fd00::3]:5000", "[fd00::10]:53", "[fd00::10]:53", 0, true},
		{unix.IPPROTO_UDP, "[fd00::2]:5000", "[fd00::10]:53", "[fd00::1]:40000", 0, false},
		{unix.IPPROTO_UDP, "[fd00::3]:5001", "[fd00::11]:53", "[fd00::11]:53", 0, false},
		{unix.IPPROTO_UDP, "[fd00::3]:5002", "[fd00::10]:53", "[fd00::1]:41000", 0, true},
	}
	for i := range 50 {
		entries = append(entries, entry{unix.IPPROTO_UDP, fmt.Sprintf("10.245.0.%d:6000", i), "198.18.0.1:53", "198.18.0.1:53", 0, false})
	}
	flows := []StaleFlows{
		{Protocol: v1.ProtocolUDP, Dst: netip.MustParseAddrPort("10.96.0.10:53"), Live: []int{40000}},
		{Protocol: v1.ProtocolUDP, Dst: netip.MustParseAddrPort("203.0.113.10:53"), Live: []int{40001}},
		{Protocol: v1.ProtocolUDP, Dst: netip.AddrPortFrom(netip.Addr{}, 30053), Live: []int{40000}},
		{Protocol: v1.ProtocolTCP, Dst: netip.MustParseAddrPort("10.96.0.20:80"), Live: []int{40002}},
		{Protocol: v1.ProtocolUDP, Dst: netip.MustParseAddrPort("[fd00::10]:53"), Live: []int{40000}},
	}
	var want []string
	for _, e := range entries {
		if !e.stale {
			want = append(want, fmt.Sprintf("%d %s %s %s", e.proto, e.src, e.dst, e.replySrc))
		}
	}
	slices.Sort(want)

	// clear makes the entries in a namespace of their own, clears them
	// (with filtered dumps: one destination at a time; else one dump of
	// the whole table per family) and returns what is left.
	clear := func(role string, filtered bool) []string {
		var left []string
		err := netns.New(t).NS(role).Do(func() error {
			for _, e := range entries {
				f := udpConntrackEntry(netip.MustParseAddrPort(e.src), netip.MustParseAddrPort(e.dst), netip.MustParseAddrPort(e.replySrc))
				f.Forward.Protocol, f.Reverse.Protocol = e.proto, e.proto
				if e.proto == unix.IPPROTO_TCP {
					f.ProtoInfo = &netlink.ProtoInfoTCP{State: e.state}
				}
				if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.InetFamily(f.FamilyType), f); err != nil {
					return fmt.Errorf("create %v: %w", e, err)
				}
			}
			var ignores atomic.Bool
			ignores.Store(!filtered)
			if filtered {
				if err := sameFieldsAsNetlink(flows); err != nil {
					return err
				}
				for _, f := range flows {
					if err := clearStale(kernelConntrack{}, []StaleFlows{f}, &ignores); err != nil {
						return err
					}
				}
				if ignores.Load() {
					return errors.New("the kernel was taken not to filter dumps")
				}
			} else if err := clearStale(kernelConntrack{}, flows, &ignores); err != nil {
				return err
			}
			for _, family := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
				list, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
				if err != nil {
					return err
				}
				for _, f := range list {
					src, _ := netip.AddrFromSlice(f.Forward.SrcIP)
					dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
					reply, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
					left = append(left, fmt.Sprintf("%d %v %v %v", f.Forward.Protocol,
						netip.AddrPortFrom(src, f.Forward.SrcPort), netip.AddrPortFrom(dst, f.Forward.DstPort), netip.AddrPortFrom(reply, f.Reverse.SrcPort)))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(left)
		return left
	}
	if got := clear("ctfiltered", true); !slices.Equal(got, want) {
		t.Errorf("cleared with filtered dumps, left:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := clear("ctwhole", false); !slices.Equal(got, want) {
		t.Errorf("cleared with dumps of the whole table, left:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// sameFieldsAsNetlink checks, for each destination of flows, that a
// filtered dump lists the entries to it (as filterKey asks) that
// netlink's dump of the whole table has, with the same fields.
func sameFieldsAsNetlink(flows []StaleFlows) error {
	fields := func(f *netlink.ConntrackFlow) string {
		s := fmt.Sprintf("%d %v %v %d %d / %v %v %d %d", f.Forward.Protocol, f.Forward.SrcIP, f.Forward.DstIP, f.Forward.SrcPort, f.Forward.DstPort,
			f.Reverse.SrcIP, f.Reverse.DstIP, f.Reverse.SrcPort, f.Reverse.DstPort)
		if tcp, ok := f.ProtoInfo.(*netlink.ProtoInfoTCP); ok {
			s += fmt.Sprintf(" state %d", tcp.State)
		}
		return s
	}
	for _, fl := range flows {
		var set staleSet
		set.add(fl)
		for key := range set {
			family := netlink.InetFamily(unix.AF_INET)
			if key.dst.Addr().Is6() {
				family = unix.AF_INET6
			}
			key = filterKey(family, key)
			entries, err := kernelConntrack{}.dumpTo(family, key)
			if err != nil {
				return fmt.Errorf("dump of %v: %w", key.dst, err)
			}
			var got, want []string
			for _, e := range entries {
				got = append(got, fields(&e.flow))
			}
			all, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
			if err != nil {
				return err
			}
			for _, f := range all {
				if key.holds(f) {
					want = append(want, fields(f))
				}
			}
			slices.Sort(got)
			slices.Sort(want)
			if len(want) == 0 || !slices.Equal(got, want) {
				return fmt.Errorf("dump filtered by %d %v: %q, want %q", key.protocol, key.dst, got, want)
			}
		}
	}
	return nil
}

// The filtered dumps ask for no zone and no mark: an entry to a stale
// destination in another conntrack zone (a CNI's, a directional one),
// with a mark, or both, is listed and deleted as one in the default zone
// is; the live and unrelated ones stay, zoned too.
func TestKernelFilteredClearingZonesAndMarks(t *testing.T) {
	netns.Require(t, "ip")
	type entry struct {
		src, dst, replySrc string
		zone               uint16
		origZone           bool // the zone applies to the original direction only
		mark               uint32
		stale              bool
	}
	entries := []entry{
		{"10.244.0.3:5000", "10.96.0.10:53", "10.96.0.10:53", 5, false, 7, true},
		{"10.244.0.4:5000", "10.96.0.10:53", "10.96.0.10:53", 0, false, 9, true},
		{"10.244.0.5:5000", "10.96.0.10:53", "10.200.0.1:41000", 3, true, 0, true},
		{"10.244.0.6:5000", "10.96.0.10:53", "10.200.0.1:40000", 5, false, 0, false},
		{"10.244.0.7:5000", "10.96.0.11:53", "10.96.0.11:53", 5, false, 7, false},
		{"198.51.100.7:6000", "10.200.0.1:30053", "10.200.0.1:30053", 4, false, 1, true},
		{"[fd00::3]:5000", "[fd00::10]:53", "[fd00::10]:53", 6, false, 2, true},
		{"[fd00::4]:5000", "[fd00::11]:53", "[fd00::11]:53", 6, false, 0, false},
	}
	flows := []StaleFlows{
		{Protocol: v1.ProtocolUDP, Dst: netip.MustParseAddrPort("10.96.0.10:53"), Live: []int{40000}},
		{Protocol: v1.ProtocolUDP, Dst: netip.AddrPortFrom(netip.Addr{}, 30053), Live: []int{40000}},
		{Protocol: v1.ProtocolUDP, Dst: netip.MustParseAddrPort("[fd00::10]:53"), Live: []int{40000}},
	}
	var want []string
	for _, e := range entries {
		if !e.stale {
			want = append(want, fmt.Sprintf("%s %s", e.src, e.dst))
		}
	}
	slices.Sort(want)
	var left []string
	err := netns.New(t).NS("ctzones").Do(func() error {
		for _, e := range entries {
			f := udpConntrackEntry(netip.MustParseAddrPort(e.src), netip.MustParseAddrPort(e.dst), netip.MustParseAddrPort(e.replySrc))
			f.Mark = e.mark
			if err := createInZone(f, e.zone, e.origZone); err != nil {
				return fmt.Errorf("create %v: %w", e, err)
			}
		}
		// One destination at a time: a filtered dump each.
		var ignores atomic.Bool
		for _, f := range flows {
			if err := clearStale(kernelConntrack{}, []StaleFlows{f}, &ignores); err != nil {
				return err
			}
		}
		if ignores.Load() {
			return errors.New("the kernel was taken not to filter dumps")
		}
		for _, family := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
			list, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
			if err != nil {
				return err
			}
			for _, f := range list {
				src, _ := netip.AddrFromSlice(f.Forward.SrcIP)
				dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
				left = append(left, fmt.Sprintf("%v %v", netip.AddrPortFrom(src, f.Forward.SrcPort), netip.AddrPortFrom(dst, f.Forward.DstPort)))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(left)
	if !slices.Equal(left, want) {
		t.Errorf("left:\n%s\nwant:\n%s", strings.Join(left, "\n"), strings.Join(want, "\n"))
	}
}

// createInZone makes the UDP entry f in conntrack zone (in both directions,
// or with origOnly the original one), which netlink.ConntrackCreate cannot
// (it sends no zone).
func createInZone(f *netlink.ConntrackFlow, zone uint16, origOnly bool) error {
	req := nl.NewNetlinkRequest(netlink.ConntrackTable<<8|nl.IPCTNL_MSG_CT_NEW, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: f.FamilyType, Version: nl.NFNETLINK_V0})
	tuple := func(typ int, t netlink.IPTuple, zoned bool) *nl.RtAttr {
		a := nl.NewRtAttr(unix.NLA_F_NESTED|typ, nil)
		ip := a.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_IP, nil)
		if f.FamilyType == unix.AF_INET6 {
			ip.AddRtAttr(nl.CTA_IP_V6_SRC, t.SrcIP)
			ip.AddRtAttr(nl.CTA_IP_V6_DST, t.DstIP)
		} else {
			ip.AddRtAttr(nl.CTA_IP_V4_SRC, t.SrcIP)
			ip.AddRtAttr(nl.CTA_IP_V4_DST, t.DstIP)
		}
		proto := a.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_PROTO, nil)
		proto.AddRtAttr(nl.CTA_PROTO_NUM, nl.Uint8Attr(t.Protocol))
		proto.AddRtAttr(nl.CTA_PROTO_SRC_PORT, nl.BEUint16Attr(t.SrcPort))
		proto.AddRtAttr(nl.CTA_PROTO_DST_PORT, nl.BEUint16Attr(t.DstPort))
		if zoned {
			a.AddRtAttr(ctaTupleZone, nl.BEUint16Attr(zone))
		}
		return a
	}
	req.AddData(tuple(nl.CTA_TUPLE_ORIG, f.Forward, origOnly && zone != 0))
	req.AddData(tuple(nl.CTA_TUPLE_REPLY, f.Reverse, false))
	if !origOnly && zone != 0 {
		req.AddData(nl.NewRtAttr(nl.CTA_ZONE, nl.BEUint16Attr(zone)))
	}
	req.AddData(nl.NewRtAttr(nl.CTA_TIMEOUT, nl.BEUint32Attr(f.TimeOut)))
	req.AddData(nl.NewRtAttr(nl.CTA_MARK, nl.BEUint32Attr(f.Mark)))
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}

// ctaTupleZone is CTA_TUPLE_ZONE, the zone of one direction of a tuple
// (linux/netfilter/nfnetlink_conntrack.h).
const ctaTupleZone = 3
