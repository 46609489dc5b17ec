package proxier

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// A dump of the whole conntrack table costs the parsing of every entry in
// Go (netlink.ConntrackDeleteFilters): ≈5.5 µs of CPU an entry, so a sync
// that clears the stale entries of one UDP Service took ≈1 s of CPU on a
// node with 250,000 entries, on every sync where a UDP port lost a
// destination. Since Linux 5.8 the kernel filters a dump by fields of the
// entries' original tuple (CTA_FILTER) and sends only the entries to the
// destination asked for; netlink has no such dump, the request is built
// here from its parts. Every dump, filtered or not, still costs a walk of
// the hash the kernel shares among all namespaces: 10 to 20 ms of system
// CPU for its 262,144 buckets on a 2-CPU machine whatever their entries, and
// ≈0.26 µs more for each entry of the namespace it passes
// (BenchmarkKernelClearStale). So a dump per destination is worth it only
// while those walks cost less than the parsing of the whole table.

// The CTA_FILTER attribute of a conntrack dump, and the flags of the
// original-tuple fields it filters by (linux/netfilter/nfnetlink_conntrack.h,
// net/netfilter/nf_conntrack_netlink.c).
const (
	ctaFilter          = 25
	ctaFilterOrigFlags = 1

	ctaFilterIPDst    = 1 << 1
	ctaFilterProtoNum = 1 << 3
	ctaFilterDstPort  = 1 << 5
)

// A walk of the hash costs the parsing of one entry in Go (≈5.5 µs) for
// every walkBucketsPerParse buckets and every walkEntriesPerParse entries
// it passes (≈0.26 µs each). A bucket took 40 to 80 ns on a shared 2-CPU
// machine: the dearest, so that dumps per destination are chosen only
// where they surely cost less.
const (
	walkBucketsPerParse = 72
	walkEntriesPerParse = 20
)

// kernelIgnoresFilter is set once the kernel refused a filtered dump, or
// answered it with entries outside the filter (a kernel before 5.8
// ignores CTA_FILTER): every clearing then dumps the whole table.
var kernelIgnoresFilter atomic.Bool

// conntrackTable is the conntrack table of the calling thread's network
// namespace as clearing uses it; a fake in tests.
type conntrackTable interface {
	// dumpTo lists the entries of family with key's protocol and original
	// destination (its port on any address when the address is invalid),
	// filtered by the kernel: a kernel that ignores the filter lists them
	// all.
	dumpTo(family netlink.InetFamily, key staleKey) ([]conntrackEntry, error)
	// delete deletes an entry that dumpTo listed.
	delete(family netlink.InetFamily, e conntrackEntry) error
	// clearAll deletes the entries of family that set matches, in one
	// dump of the whole table.
	clearAll(family netlink.InetFamily, set staleSet) error
	// size is the number of entries in the table and of buckets in the
	// hash the kernel walks for each dump.
	size() (entries, buckets int, err error)
}

// conntrackEntry is an entry of the table: the fields staleSet matches on,
// and the kernel's message, which deletes it.
type conntrackEntry struct {
	flow netlink.ConntrackFlow
	msg  []byte
}

// clearFamily deletes the entries of family that set matches: with a dump
// per destination the kernel filters when their walks of the hash cost
// less than the parsing of the whole table (filteredDumps), so that the
// cost is that of the entries to them and not of the table; with one dump
// of the whole table otherwise, or when the kernel does not filter
// (ignoresFilter).
func clearFamily(t conntrackTable, family netlink.InetFamily, set staleSet, ignoresFilter *atomic.Bool) error {
	keys := map[staleKey]bool{}
	for key := range set {
		keys[filterKey(family, key)] = true
	}
	if ignoresFilter.Load() || !filteredDumps(t, len(keys)) {
		return t.clearAll(family, set)
	}
	var errs []error
	deleteFailed := 0
	for key := range keys {
		entries, err := t.dumpTo(family, key)
		switch {
		case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL):
			// The kernel refused the filter: the entries of every
			// destination, in one dump, from now on.
			if ignoresFilter.CompareAndSwap(false, true) {
				klog.InfoS("The kernel does not filter conntrack dumps (before Linux 5.8?): stale entries are cleared with dumps of the whole table", "err", err)
			}
			return t.clearAll(family, set)
		case errors.Is(err, netlink.ErrDumpInterrupted):
			// The table changed during the dump: the entries listed
			// are cleared, as netlink's whole-table clearing does.
			errs = append(errs, err)
		case err != nil:
			return err
		}
		unfiltered := false
		for _, e := range entries {
			// Matched against every destination: an entry to another
			// one (the kernel ignored the filter) is as stale.
			unfiltered = unfiltered || !key.holds(&e.flow)
			if !set.MatchConntrackFlow(&e.flow) {
				continue
			}
			if err := t.delete(family, e); err != nil && !errors.Is(err, unix.ENOENT) {
				deleteFailed++
			}
		}
		if unfiltered {
			// That was the whole table, matched against every
			// destination: done, and the whole table from now on.
			if ignoresFilter.CompareAndSwap(false, true) {
				klog.InfoS("The kernel ignores the filter of conntrack dumps (before Linux 5.8?): stale entries are cleared with dumps of the whole table")
			}
			break
		}
	}
	if deleteFailed > 0 {
		errs = append(errs, fmt.Errorf("failed to delete %d conntrack entries", deleteFailed))
	}
	return errors.Join(errs...)
}

// filteredDumps reports whether dumps of the entries to each of n
// destinations cost less than a dump of the whole table: n walks of the
// hash against one, and the parsing of every entry. One always does.
func filteredDumps(t conntrackTable, n int) bool {
	if n <= 1 {
		return true
	}
	entries, buckets, err := t.size()
	if err != nil {
		klog.V(2).InfoS("Conntrack table size unknown: its stale entries are cleared in one dump of the whole table", "err", err)
		return false
	}
	walk := buckets/walkBucketsPerParse + entries/walkEntriesPerParse
	return (n-1)*walk < entries
}

// filterKey is what a dump for key's entries asks the kernel: IPv6
// destinations by port only, as kernels from 5.8 on compare IPv6
// addresses of the filter the wrong way round (!ipv6_addr_cmp: only the
// entries to other addresses pass); their address is matched here.
func filterKey(family netlink.InetFamily, key staleKey) staleKey {
	if family == unix.AF_INET6 {
		key.dst = netip.AddrPortFrom(netip.Addr{}, key.dst.Port())
	}
	return key
}

// holds reports whether flow is one that a dump filtered by k lists.
func (k staleKey) holds(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != k.protocol || flow.Forward.DstPort != k.dst.Port() {
		return false
	}
	dst, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	return ok && (!k.dst.Addr().IsValid() || dst.Unmap() == k.dst.Addr())
}

// kernelConntrack is the kernel's conntrack table, over netlink.
type kernelConntrack struct{}

func (kernelConntrack) dumpTo(family netlink.InetFamily, key staleKey) ([]conntrackEntry, error) {
	req := nl.NewNetlinkRequest(netlink.ConntrackTable<<8|nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(family), Version: nl.NFNETLINK_V0})
	flags := uint32(ctaFilterProtoNum | ctaFilterDstPort)
	orig := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_ORIG, nil)
	if addr := key.dst.Addr(); addr.IsValid() {
		flags |= ctaFilterIPDst
		ip := orig.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_IP, nil)
		if addr.Is4() {
			ip.AddRtAttr(nl.CTA_IP_V4_DST, addr.AsSlice())
		} else {
			ip.AddRtAttr(nl.CTA_IP_V6_DST, addr.AsSlice())
		}
	}
	proto := orig.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_PROTO, nil)
	proto.AddRtAttr(nl.CTA_PROTO_NUM, nl.Uint8Attr(key.protocol))
	proto.AddRtAttr(nl.CTA_PROTO_DST_PORT, nl.BEUint16Attr(key.dst.Port()))
	filter := nl.NewRtAttr(unix.NLA_F_NESTED|ctaFilter, nil)
	filter.AddRtAttr(ctaFilterOrigFlags, nl.Uint32Attr(flags))
	req.AddData(orig)
	req.AddData(filter)
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	entries := make([]conntrackEntry, 0, len(msgs))
	for _, msg := range msgs {
		entries = append(entries, conntrackEntry{flow: parseConntrackEntry(msg), msg: msg})
	}
	return entries, err
}

func (kernelConntrack) delete(family netlink.InetFamily, e conntrackEntry) error {
	req := nl.NewNetlinkRequest(netlink.ConntrackTable<<8|nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(family), Version: nl.NFNETLINK_V0})
	// The entry's own attributes: its tuple, and its id, so that an entry
	// made anew with the same tuple meanwhile is not the one deleted.
	req.AddRawData(e.msg[nl.SizeofNfgenmsg:])
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}

func (kernelConntrack) size() (entries, buckets int, err error) {
	// Of the calling thread's namespace: /proc/sys/net is that of the
	// thread that opens it.
	if entries, err = readSysctlInt("/proc/sys/net/netfilter/nf_conntrack_count"); err != nil {
		return 0, 0, err
	}
	buckets, err = readSysctlInt("/proc/sys/net/netfilter/nf_conntrack_buckets")
	return entries, buckets, err
}

// readSysctlInt reads the integer in the file at path.
func readSysctlInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func (kernelConntrack) clearAll(family netlink.InetFamily, set staleSet) error {
	_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, set)
	return err
}

// parseConntrackEntry reads, out of a conntrack message (its netfilter
// header and attributes), the fields staleSet matches on: the original and
// reply tuples and the TCP state. What it cannot read stays zero, which
// matches nothing.
func parseConntrackEntry(msg []byte) netlink.ConntrackFlow {
	var flow netlink.ConntrackFlow
	if len(msg) < nl.SizeofNfgenmsg {
		return flow
	}
	flow.FamilyType = msg[0]
	for _, attr := range nestedAttrs(msg[nl.SizeofNfgenmsg:]) {
		switch attr.Attr.Type & nl.NLA_TYPE_MASK {
		case nl.CTA_TUPLE_ORIG:
			parseConntrackTuple(attr.Value, &flow.Forward)
		case nl.CTA_TUPLE_REPLY:
			parseConntrackTuple(attr.Value, &flow.Reverse)
		case nl.CTA_PROTOINFO:
			for _, info := range nestedAttrs(attr.Value) {
				if info.Attr.Type&nl.NLA_TYPE_MASK != nl.CTA_PROTOINFO_TCP {
					continue
				}
				for _, a := range nestedAttrs(info.Value) {
					if a.Attr.Type&nl.NLA_TYPE_MASK == nl.CTA_PROTOINFO_TCP_STATE && len(a.Value) == 1 {
						flow.ProtoInfo = &netlink.ProtoInfoTCP{State: a.Value[0]}
					}
				}
			}
		}
	}
	return flow
}

// parseConntrackTuple reads a CTA_TUPLE_ORIG or CTA_TUPLE_REPLY's value.
func parseConntrackTuple(b []byte, t *netlink.IPTuple) {
	for _, attr := range nestedAttrs(b) {
		switch attr.Attr.Type & nl.NLA_TYPE_MASK {
		case nl.CTA_TUPLE_IP:
			for _, a := range nestedAttrs(attr.Value) {
				switch a.Attr.Type & nl.NLA_TYPE_MASK {
				case nl.CTA_IP_V4_SRC, nl.CTA_IP_V6_SRC:
					t.SrcIP = a.Value
				case nl.CTA_IP_V4_DST, nl.CTA_IP_V6_DST:
					t.DstIP = a.Value
				}
			}
		case nl.CTA_TUPLE_PROTO:
			for _, a := range nestedAttrs(attr.Value) {
				switch typ := a.Attr.Type & nl.NLA_TYPE_MASK; {
				case typ == nl.CTA_PROTO_NUM && len(a.Value) == 1:
					t.Protocol = a.Value[0]
				case typ == nl.CTA_PROTO_SRC_PORT && len(a.Value) == 2:
					t.SrcPort = binary.BigEndian.Uint16(a.Value)
				case typ == nl.CTA_PROTO_DST_PORT && len(a.Value) == 2:
					t.DstPort = binary.BigEndian.Uint16(a.Value)
				}
			}
		}
	}
}

// nestedAttrs is the attributes in b; none when b is malformed.
func nestedAttrs(b []byte) []syscall.NetlinkRouteAttr {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return nil
	}
	return attrs
}
