package config

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DefaultServiceClusterIPRange is kube-apiserver's --service-cluster-ip-range
// as kubeadm sets it: where manifests mode takes the ClusterIP of a Service
// that names none.
const DefaultServiceClusterIPRange = "10.96.0.0/12"

// ParseServiceClusterIPRange parses --service-cluster-ip-range as
// kube-apiserver does: one CIDR, or two of different IP families (the first
// is the primary). Empty means no range: a Service without clusterIP is then
// an error.
func ParseServiceClusterIPRange(s string) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR", strings.TrimSpace(f))
		}
		p = p.Masked()
		// Room for at least two Services besides the network (and, for
		// IPv4, broadcast) address.
		if p.Addr().BitLen()-p.Bits() < 2 {
			return nil, fmt.Errorf("%s is too small (at most /%d)", p, p.Addr().BitLen()-2)
		}
		out = append(out, p)
	}
	if len(out) > 2 || (len(out) == 2 && out[0].Addr().Is4() == out[1].Addr().Is4()) {
		return nil, fmt.Errorf("%q: want one CIDR, or two of different IP families", s)
	}
	return out, nil
}

// clusterIPAllocator gives Services that name no clusterIP one from the
// range. What each gets is a function of the set of Services the files hold,
// not of the order they came in, so that a restart with the same files (or
// another node with the same files) gives every Service the address it had:
// the Services, in the order of the hash of their namespace/name (then of
// the name), each take their hash's slot in the range or the next free
// address after it. The price of keeping no state: a Service that found its
// slot taken can move when a Service that ranks before it for that stretch
// of the range is added or removed (see README).
type clusterIPAllocator struct {
	ranges []netip.Prefix
	given  map[objectKey][]netip.Addr // the last allocation, so that only changes are logged
}

func newClusterIPAllocator(ranges []netip.Prefix) clusterIPAllocator {
	return clusterIPAllocator{ranges: ranges, given: map[objectKey][]netip.Addr{}}
}

// allocation is an address newly given to a Service, for the log; was is
// the one it had before, if any.
type allocation struct {
	key      objectKey
	ips, was []netip.Addr
	from     []netip.Prefix
	named    int // how many of ips the Service names (a dual-stack one's primary)
}

func (a allocation) String() string {
	msg := fmt.Sprintf("%s has no clusterIP: allocated %s from --service-cluster-ip-range %s",
		a.key, addrs(a.ips), prefixes(a.from))
	if a.named > 0 {
		msg = fmt.Sprintf("%s names clusterIP %s, and its ipFamilyPolicy asks for both IP families: allocated %s from --service-cluster-ip-range %s",
			a.key, addrs(a.ips[:a.named]), addrs(a.ips[a.named:]), prefixes(a.from[a.named:]))
	}
	if len(a.was) > 0 {
		msg += fmt.Sprintf(" (moved from %s: the Services allocated from the range changed)", addrs(a.was))
	}
	return msg
}

// place gives every Service of desired that names no clusterIP one, then
// leaves out each Service that claims what another holds; served is what
// the handler has now.
func (a *clusterIPAllocator) place(desired, served map[objectKey]servedObject) ([]allocation, []error) {
	allocated, errs := a.assign(desired, served)
	// After allocation: an allocated address never clashes (the allocator
	// steps around named ones), and the served versions carry theirs.
	return allocated, append(errs, resolveClaims(desired, served)...)
}

// assign sets spec.clusterIP(s) of every Service in desired that has none
// (and is not headless or ExternalName), on a copy. A Service that cannot
// get one is left out of desired with an error naming it.
//
// Addresses that files name are stepped around, but not one that a served
// Service was allocated: as the API server, which refuses a clusterIP it
// has allocated, the served Service keeps it and resolveClaims refuses the
// Service that names it (or keeps that one's last good version).
func (a *clusterIPAllocator) assign(desired, served map[objectKey]servedObject) ([]allocation, []error) {
	type needer struct {
		key objectKey
		sum uint64
	}
	var needers []needer
	var named []objectKey
	for k, o := range desired {
		svc, ok := o.obj.(*v1.Service)
		if !ok {
			continue
		}
		if a.needsClusterIP(svc) {
			needers = append(needers, needer{k, slotHash(k)})
		}
		if svc.Spec.ClusterIP != "" {
			named = append(named, k)
		}
	}
	held := map[netip.Addr]objectKey{}
	for _, n := range needers {
		for _, ip := range a.heldBy(n.key, desired, served) {
			held[ip] = n.key
		}
	}
	taken := map[netip.Addr]bool{}
	pinned := map[objectKey]bool{}
	for _, k := range named {
		ips := serviceAddrs(desired[k].obj)
		refused := false
		for _, ip := range ips {
			if h, ok := held[ip]; ok && h != k {
				pinned[h], refused = true, true
			}
		}
		if refused {
			ips = nil // what resolveClaims keeps of it instead: its served version, if any
			if prev, ok := served[k]; ok {
				ips = serviceAddrs(prev.obj)
			}
		}
		for _, ip := range ips {
			taken[ip] = true
		}
	}
	given := make(map[objectKey][]netip.Addr, len(needers))
	for k := range pinned {
		given[k] = a.heldBy(k, desired, served)
		for _, ip := range given[k] {
			taken[ip] = true
		}
	}

	slices.SortFunc(needers, func(x, y needer) int {
		return cmp.Or(cmp.Compare(x.sum, y.sum), cmp.Compare(x.key.String(), y.key.String()))
	})
	var news []allocation
	var errs []error
	for _, n := range needers {
		k, o := n.key, desired[n.key]
		svc := o.obj.(*v1.Service)
		ranges, err := a.rangesFor(svc)
		named := serviceAddrs(svc) // a dual-stack Service's own primary: the other family's is allocated
		ips, ok := given[k]
		if !ok && err == nil {
			ips, err = allocate(n.sum, ranges[len(named):], taken)
			ips = append(named, ips...)
		}
		if err != nil {
			delete(desired, k)
			errs = append(errs, &ManifestError{File: o.file, Doc: o.doc, Kind: k.Kind, Namespace: k.Namespace, Name: k.Name, Err: err})
			continue
		}
		given[k] = ips
		if was := a.given[k]; !slices.Equal(was, ips) {
			news = append(news, allocation{key: k, ips: ips, was: was, from: ranges, named: len(named)})
		}
		cp := svc.DeepCopy()
		cp.Spec.ClusterIPs = nil
		for _, ip := range ips {
			cp.Spec.ClusterIPs = append(cp.Spec.ClusterIPs, ip.String())
		}
		cp.Spec.ClusterIP = cp.Spec.ClusterIPs[0]
		o.obj, o.allocated = cp, true
		desired[k] = o
	}
	a.given = given
	slices.SortFunc(news, func(x, y allocation) int { return cmp.Compare(x.key.String(), y.key.String()) })
	return news, errs
}

// heldBy is the addresses Service k is served with when they were
// allocated to it and still fit the ranges it gets addresses from; else nil.
func (a *clusterIPAllocator) heldBy(k objectKey, desired, served map[objectKey]servedObject) []netip.Addr {
	prev, ok := served[k]
	if !ok || !prev.allocated {
		return nil
	}
	svc := desired[k].obj.(*v1.Service)
	ranges, err := a.rangesFor(svc)
	ips, named := serviceAddrs(prev.obj), serviceAddrs(svc)
	if err != nil || len(ips) != len(ranges) || !slices.Equal(ips[:len(named)], named) {
		return nil
	}
	for i, r := range ranges[len(named):] {
		if !r.Contains(ips[len(named)+i]) {
			return nil
		}
	}
	return ips
}

// serviceAddrs is the cluster IPs a Service names (none for "None").
func serviceAddrs(obj runtime.Object) []netip.Addr {
	var out []netip.Addr
	for _, ip := range obj.(*v1.Service).Spec.ClusterIPs {
		if addr, err := netip.ParseAddr(ip); err == nil {
			out = append(out, addr.Unmap())
		}
	}
	return out
}

// needsClusterIP reports whether the Service needs addresses from the
// ranges: it names none, or names one and its ipFamilyPolicy asks for both
// families, which kube-apiserver gives it on a dual-stack range (and
// refuses for RequireDualStack on a single-stack one: rangesFor says so).
// Without ranges a Service is served with what it names.
func (a *clusterIPAllocator) needsClusterIP(svc *v1.Service) bool {
	if svc.Spec.Type == v1.ServiceTypeExternalName || svc.Spec.ClusterIP == v1.ClusterIPNone {
		return false
	}
	if svc.Spec.ClusterIP == "" {
		return true
	}
	policy := svc.Spec.IPFamilyPolicy
	dualStack := policy != nil && *policy != v1.IPFamilyPolicySingleStack
	return len(svc.Spec.ClusterIPs) == 1 && dualStack && len(a.ranges) > 0 &&
		(len(a.ranges) == 2 || *policy == v1.IPFamilyPolicyRequireDualStack)
}

// rangesFor picks the ranges a Service gets its addresses from, one per
// IP family, as kube-apiserver's defaulting picks the families
// (initIPFamilyFields): those of the clusterIPs it names, then those it
// lists in spec.ipFamilies, else the primary range's; a dual-stack policy
// on a dual-stack range adds the other family. The first len(named)
// ranges are those of the addresses it names.
func (a *clusterIPAllocator) rangesFor(svc *v1.Service) ([]netip.Prefix, error) {
	if len(a.ranges) == 0 {
		return nil, errors.New(`spec.clusterIP: not set, and --service-cluster-ip-range is empty: ` +
			`set spec.clusterIP (or "None" for a headless Service), or give the proxy a range to allocate from`)
	}
	policy := svc.Spec.IPFamilyPolicy
	if policy != nil && *policy == v1.IPFamilyPolicyRequireDualStack && len(a.ranges) < 2 {
		return nil, fmt.Errorf("spec.ipFamilyPolicy: RequireDualStack, but --service-cluster-ip-range %s has one IP family "+
			"(kube-apiserver refuses it: the cluster is not configured for dual-stack Services)", prefixes(a.ranges))
	}
	var families []bool // is IPv4
	for _, ip := range serviceAddrs(svc) {
		families = append(families, ip.Is4())
	}
	for _, fam := range svc.Spec.IPFamilies {
		if four := fam == v1.IPv4Protocol; !slices.Contains(families, four) {
			families = append(families, four)
		}
	}
	if len(families) == 0 {
		families = append(families, a.ranges[0].Addr().Is4())
	}
	if policy != nil && *policy != v1.IPFamilyPolicySingleStack && len(families) == 1 && len(a.ranges) == 2 {
		families = append(families, !families[0])
	}
	var out []netip.Prefix
	for _, four := range families {
		i := slices.IndexFunc(a.ranges, func(p netip.Prefix) bool { return p.Addr().Is4() == four })
		if i < 0 {
			fam := v1.IPv6Protocol
			if four {
				fam = v1.IPv4Protocol
			}
			return nil, fmt.Errorf("spec.ipFamilies: no %s range in --service-cluster-ip-range %s to allocate a clusterIP from", fam, prefixes(a.ranges))
		}
		out = append(out, a.ranges[i])
	}
	return out, nil
}

func addrs(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ",")
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// slotHash places namespace/name in the range: its slot is the hash modulo
// the range's size.
func slotHash(k objectKey) uint64 {
	h := fnv.New64a()
	h.Write([]byte(k.Namespace + "/" + k.Name))
	return h.Sum64()
}

// allocate takes one free address per range for the Service whose slotHash
// is sum: its slot, or the next free one after it.
func allocate(sum uint64, ranges []netip.Prefix, taken map[netip.Addr]bool) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, r := range ranges {
		size := usableSize(r)
		start := sum % size
		var got netip.Addr
		for i := uint64(0); i < size; i++ {
			ip := offsetAddr(r.Addr(), 1+(start+i)%size)
			if !taken[ip] {
				got = ip
				break
			}
		}
		if !got.IsValid() {
			return nil, fmt.Errorf("spec.clusterIP: not set, and --service-cluster-ip-range %s is full", r)
		}
		taken[got] = true
		out = append(out, got)
	}
	return out, nil
}

// usableSize is how many addresses of r can be ClusterIPs: all but the
// network address (and, for IPv4, the broadcast address); a huge IPv6 range
// is used up to 2^63 addresses.
func usableSize(r netip.Prefix) uint64 {
	bits := min(r.Addr().BitLen()-r.Bits(), 63)
	size := uint64(1) << bits
	if r.Addr().Is4() {
		return size - 2
	}
	return size - 1
}

// offsetAddr is base + off; off stays inside base's host part.
func offsetAddr(base netip.Addr, off uint64) netip.Addr {
	if base.Is4() {
		b := base.As4()
		binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+uint32(off))
		return netip.AddrFrom4(b)
	}
	b := base.As16()
	lo := binary.BigEndian.Uint64(b[8:]) + off
	binary.BigEndian.PutUint64(b[8:], lo)
	return netip.AddrFrom16(b)
}
