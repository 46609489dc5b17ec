package config

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
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
// range, as the API server would: the same address for the same
// namespace/name on every start (a hash into the range, probing to the next
// free address on collision), and the address it got for as long as the
// Service exists, even when a Service added later hashes to it.
type clusterIPAllocator struct {
	ranges   []netip.Prefix
	assigned map[objectKey][]netip.Addr
}

func newClusterIPAllocator(ranges []netip.Prefix) clusterIPAllocator {
	return clusterIPAllocator{ranges: ranges, assigned: map[objectKey][]netip.Addr{}}
}

// allocation is one address newly given to a Service, for the log.
type allocation struct {
	key  objectKey
	ips  []netip.Addr
	from []netip.Prefix
}

func (a allocation) String() string {
	ips := make([]string, len(a.ips))
	for i, ip := range a.ips {
		ips[i] = ip.String()
	}
	from := make([]string, len(a.from))
	for i, p := range a.from {
		from[i] = p.String()
	}
	return fmt.Sprintf("%s has no clusterIP: allocated %s from --service-cluster-ip-range %s",
		a.key, strings.Join(ips, ","), strings.Join(from, ","))
}

// assign sets spec.clusterIP(s) of every Service in desired that has none
// (and is not headless or ExternalName), on a copy. A Service that cannot
// get one is left out of desired with an error naming it.
func (a *clusterIPAllocator) assign(desired map[objectKey]servedObject) ([]allocation, []error) {
	taken := map[netip.Addr]bool{}
	var needers []objectKey
	for k, o := range desired {
		svc, ok := o.obj.(*v1.Service)
		if !ok {
			continue
		}
		if !needsClusterIP(svc) {
			for _, ip := range svc.Spec.ClusterIPs {
				if addr, err := netip.ParseAddr(ip); err == nil {
					taken[addr.Unmap()] = true
				}
			}
			continue
		}
		needers = append(needers, k)
	}
	for k := range a.assigned {
		if o, ok := desired[k]; !ok || !needsClusterIP(o.obj.(*v1.Service)) {
			delete(a.assigned, k) // gone, or names its own address now
		}
	}
	slices.SortFunc(needers, func(x, y objectKey) int { return strings.Compare(x.String(), y.String()) })

	// Addresses held from before are kept first, so that a newcomer probes
	// around them instead of taking one.
	for _, k := range needers {
		for _, ip := range a.assigned[k] {
			if taken[ip] {
				delete(a.assigned, k) // an explicit clusterIP claimed it
				break
			}
		}
		for _, ip := range a.assigned[k] {
			taken[ip] = true
		}
	}

	var news []allocation
	var errs []error
	for _, k := range needers {
		o := desired[k]
		svc := o.obj.(*v1.Service)
		ips, ok := a.assigned[k]
		if !ok {
			ranges, err := a.rangesFor(svc)
			if err == nil {
				ips, err = allocate(k, ranges, taken)
			}
			if err != nil {
				delete(desired, k)
				errs = append(errs, &ManifestError{File: o.file, Doc: o.doc, Kind: k.Kind, Namespace: k.Namespace, Name: k.Name, Err: err})
				continue
			}
			a.assigned[k] = ips
			news = append(news, allocation{key: k, ips: ips, from: ranges})
		}
		cp := svc.DeepCopy()
		cp.Spec.ClusterIPs = nil
		for _, ip := range ips {
			cp.Spec.ClusterIPs = append(cp.Spec.ClusterIPs, ip.String())
		}
		cp.Spec.ClusterIP = cp.Spec.ClusterIPs[0]
		o.obj = cp
		desired[k] = o
	}
	return news, errs
}

func needsClusterIP(svc *v1.Service) bool {
	return svc.Spec.ClusterIP == "" && svc.Spec.Type != v1.ServiceTypeExternalName
}

// rangesFor picks the ranges a Service gets an address from: the families
// it lists in spec.ipFamilies, both for a dual-stack policy when two ranges
// exist, else the primary range.
func (a *clusterIPAllocator) rangesFor(svc *v1.Service) ([]netip.Prefix, error) {
	if len(a.ranges) == 0 {
		return nil, errors.New(`spec.clusterIP: not set, and --service-cluster-ip-range is empty: ` +
			`set spec.clusterIP (or "None" for a headless Service), or give the proxy a range to allocate from`)
	}
	if len(svc.Spec.IPFamilies) > 0 {
		var out []netip.Prefix
		for _, fam := range svc.Spec.IPFamilies {
			i := slices.IndexFunc(a.ranges, func(p netip.Prefix) bool { return p.Addr().Is4() == (fam == v1.IPv4Protocol) })
			if i < 0 {
				return nil, fmt.Errorf("spec.ipFamilies: no %s range in --service-cluster-ip-range %s to allocate a clusterIP from", fam, prefixes(a.ranges))
			}
			out = append(out, a.ranges[i])
		}
		return out, nil
	}
	policy := svc.Spec.IPFamilyPolicy
	if policy != nil && *policy == v1.IPFamilyPolicyRequireDualStack && len(a.ranges) < 2 {
		return nil, fmt.Errorf("spec.ipFamilyPolicy: RequireDualStack, but --service-cluster-ip-range %s has one IP family", prefixes(a.ranges))
	}
	if policy != nil && *policy != v1.IPFamilyPolicySingleStack {
		return a.ranges, nil
	}
	return a.ranges[:1], nil
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// allocate takes one free address per range for k: its hash's slot, or the
// next free one after it.
func allocate(k objectKey, ranges []netip.Prefix, taken map[netip.Addr]bool) ([]netip.Addr, error) {
	h := fnv.New64a()
	h.Write([]byte(k.Namespace + "/" + k.Name))
	sum := h.Sum64()
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
