package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func TestParseServiceClusterIPRange(t *testing.T) {
	tests := []struct {
		in, want, wantErr string
	}{
		{in: "", want: "[]"},
		{in: "10.96.0.0/12", want: "[10.96.0.0/12]"},
		{in: "10.96.1.1/12", want: "[10.96.0.0/12]"},
		{in: "10.96.0.0/12, fd00:10:96::/108", want: "[10.96.0.0/12 fd00:10:96::/108]"},
		{in: "fd00::/64", want: "[fd00::/64]"},
		{in: "10.96.0.0", wantErr: "not a CIDR"},
		{in: "10.0.0.0/31", wantErr: "too small"},
		{in: "10.0.0.0/8,10.1.0.0/16", wantErr: "different IP families"},
		{in: "10.0.0.0/8,fd00::/64,fd01::/64", wantErr: "different IP families"},
	}
	for _, tt := range tests {
		got, err := ParseServiceClusterIPRange(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%q: err %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != tt.want {
			t.Errorf("%q: got %v %v, want %s", tt.in, got, err, tt.want)
		}
	}
}

type svcOpt func(*v1.Service)

func svc(name string, opts ...svcOpt) *v1.Service {
	s := &v1.Service{}
	s.Namespace, s.Name = "default", name
	s.Spec.Type = v1.ServiceTypeClusterIP
	s.Spec.Ports = []v1.ServicePort{{Port: 80}}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withIP(ips ...string) svcOpt {
	return func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = ips[0], ips }
}

// desiredOf is what resolve would hand the allocator: the Services by key.
func desiredOf(svcs ...*v1.Service) map[objectKey]servedObject {
	m := map[objectKey]servedObject{}
	for _, s := range svcs {
		k := objectKey{KindService, s.Namespace, s.Name}
		m[k] = servedObject{key: k, source: k, file: "svc.yaml", doc: 1, obj: s}
	}
	return m
}

func clusterIPsOf(d map[objectKey]servedObject, name string) []string {
	o, ok := d[objectKey{KindService, "default", name}]
	if !ok {
		return nil
	}
	return o.obj.(*v1.Service).Spec.ClusterIPs
}

func mustRange(t *testing.T, s string) []netip.Prefix {
	t.Helper()
	r, err := ParseServiceClusterIPRange(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Services without clusterIP get one from the range, the same one on every
// start, inside the range and never its network or broadcast address;
// headless and ExternalName Services are left alone; explicit addresses are
// never handed out; the files' objects are not modified.
func TestClusterIPAllocation(t *testing.T) {
	tests := []struct {
		name    string
		ranges  string
		svcs    []*v1.Service
		check   func(t *testing.T, d map[objectKey]servedObject)
		wantErr string
	}{
		{name: "IPv4 default range", ranges: DefaultServiceClusterIPRange, svcs: []*v1.Service{svc("web"), svc("db")},
			check: func(t *testing.T, d map[objectKey]servedObject) {
				r := netip.MustParsePrefix("10.96.0.0/12")
				for _, n := range []string{"web", "db"} {
					ips := clusterIPsOf(d, n)
					if len(ips) != 1 || !r.Contains(netip.MustParseAddr(ips[0])) {
						t.Errorf("%s: %v, want one address in %s", n, ips, r)
					}
				}
				if clusterIPsOf(d, "web")[0] == clusterIPsOf(d, "db")[0] {
					t.Errorf("web and db share %s", clusterIPsOf(d, "web")[0])
				}
			}},
		{name: "IPv6 range", ranges: "fd00:10:96::/108", svcs: []*v1.Service{svc("web")},
			check: func(t *testing.T, d map[objectKey]servedObject) {
				ips := clusterIPsOf(d, "web")
				if len(ips) != 1 || !netip.MustParsePrefix("fd00:10:96::/108").Contains(netip.MustParseAddr(ips[0])) {
					t.Errorf("web: %v", ips)
				}
			}},
		{name: "huge IPv6 range", ranges: "fd00::/48", svcs: []*v1.Service{svc("web")},
			check: func(t *testing.T, d map[objectKey]servedObject) {
				if ips := clusterIPsOf(d, "web"); len(ips) != 1 || !netip.MustParsePrefix("fd00::/48").Contains(netip.MustParseAddr(ips[0])) {
					t.Errorf("web: %v", ips)
				}
			}},
		{name: "a /30 holds two and never .0 or .3", ranges: "10.0.0.0/30", svcs: []*v1.Service{svc("a"), svc("b")},
			check: func(t *testing.T, d map[objectKey]servedObject) {
				got := clusterIPsOf(d, "a")[0] + " " + clusterIPsOf(d, "b")[0]
				if got != "10.0.0.1 10.0.0.2" && got != "10.0.0.2 10.0.0.1" {
					t.Errorf("a b got %s, want .1 and .2", got)
				}
			}},
		{name: "full range: the last by hash gets none", ranges: "10.0.0.0/30", svcs: []*v1.Service{svc("a"), svc("b"), svc("c")}, wantErr: "Service default/a: spec.clusterIP: not set, and --service-cluster-ip-range 10.0.0.0/30 is full"},
		{name: "explicit addresses are not handed out", ranges: "10.0.0.0/30", svcs: []*v1.Service{svc("a"), svc("x", withIP("10.0.0.1")), svc("y", withIP("10.0.0.2"))},
			wantErr: "Service default/a: spec.clusterIP: not set, and --service-cluster-ip-range 10.0.0.0/30 is full"},
		{name: "headless and ExternalName untouched", ranges: DefaultServiceClusterIPRange,
			svcs: []*v1.Service{svc("h", withIP("None")), svc("ext", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName })},
			check: func(t *testing.T, d map[objectKey]servedObject) {
				if ips := clusterIPsOf(d, "h"); len(ips) != 1 || ips[0] != "None" {
					t.Errorf("headless: %v", ips)
				}
				if ips := clusterIPsOf(d, "ext"); len(ips) != 0 {
					t.Errorf("ExternalName: %v", ips)
				}
			}},
		{name: "dual stack by policy", ranges: "10.96.0.0/12,fd00::/108",
			svcs: []*v1.Service{svc("d", func(s *v1.Service) { s.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyPreferDualStack) })},
			check: func(t *testing.T, d map[objectKey]servedObject) {
				ips := clusterIPsOf(d, "d")
				if len(ips) != 2 || !netip.MustParseAddr(ips[0]).Is4() || !netip.MustParseAddr(ips[1]).Is6() {
					t.Errorf("dual stack: %v", ips)
				}
			}},
		{name: "family by ipFamilies", ranges: "10.96.0.0/12,fd00::/108",
			svcs: []*v1.Service{svc("six", func(s *v1.Service) { s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol} })},
			check: func(t *testing.T, d map[objectKey]servedObject) {
				if ips := clusterIPsOf(d, "six"); len(ips) != 1 || !netip.MustParseAddr(ips[0]).Is6() {
					t.Errorf("ipFamilies IPv6: %v", ips)
				}
			}},
		{name: "family without a range", ranges: "10.96.0.0/12",
			svcs:    []*v1.Service{svc("six", func(s *v1.Service) { s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol} })},
			wantErr: "svc.yaml: Service default/six: spec.ipFamilies: no IPv6 range in --service-cluster-ip-range 10.96.0.0/12"},
		{name: "empty range is an error naming the Service", ranges: "", svcs: []*v1.Service{svc("web"), svc("set", withIP("10.0.0.5"))},
			wantErr: "svc.yaml: Service default/web: spec.clusterIP: not set, and --service-cluster-ip-range is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newClusterIPAllocator(mustRange(t, tt.ranges))
			d := desiredOf(tt.svcs...)
			_, errs := a.assign(d, nil)
			for _, s := range tt.svcs {
				if s.Spec.ClusterIP == "" && len(s.Spec.ClusterIPs) != 0 {
					t.Errorf("%s: the file's object was modified", s.Name)
				}
			}
			if tt.wantErr != "" {
				if len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.wantErr) {
					t.Fatalf("errors %v, want one containing %q", errs, tt.wantErr)
				}
				if strings.Contains(tt.wantErr, "Service default/") {
					name := strings.SplitN(strings.SplitN(tt.wantErr, "Service default/", 2)[1], ":", 2)[0]
					if _, ok := d[objectKey{KindService, "default", name}]; ok {
						t.Errorf("%s without an address is still served", name)
					}
				}
				return
			}
			if len(errs) > 0 {
				t.Fatalf("errors: %v", errs)
			}
			tt.check(t, d)
		})
	}
}

// The IP families a Service gets follow kube-apiserver's defaulting
// (initIPFamilyFields): a Prefer- or RequireDualStack Service on a
// dual-stack range gets both families whatever one it lists or names (the
// other is appended and its address allocated), and RequireDualStack on a
// single-stack range is refused. Only the listed family was served before,
// and a Service naming its clusterIP never got a secondary one.
func TestClusterIPFamiliesFollowThePolicy(t *testing.T) {
	policy := func(p v1.IPFamilyPolicy, fams ...v1.IPFamily) svcOpt {
		return func(s *v1.Service) { s.Spec.IPFamilyPolicy, s.Spec.IPFamilies = ptr.To(p), fams }
	}
	const dual = "10.96.0.0/16,fd00:96::/112"
	for _, tt := range []struct {
		name    string
		ranges  string
		svc     *v1.Service
		want    string // each clusterIP's family or named address, in order
		wantErr string
	}{
		{"RequireDualStack, IPv6 listed", dual, svc("s", policy(v1.IPFamilyPolicyRequireDualStack, v1.IPv6Protocol)), "IPv6,IPv4", ""},
		{"PreferDualStack, IPv6 listed", dual, svc("s", policy(v1.IPFamilyPolicyPreferDualStack, v1.IPv6Protocol)), "IPv6,IPv4", ""},
		{"PreferDualStack, IPv4 listed", dual, svc("s", policy(v1.IPFamilyPolicyPreferDualStack, v1.IPv4Protocol)), "IPv4,IPv6", ""},
		{"PreferDualStack, none listed", dual, svc("s", policy(v1.IPFamilyPolicyPreferDualStack)), "IPv4,IPv6", ""},
		{"PreferDualStack, IPv6-first range", "fd00:96::/112,10.96.0.0/16", svc("s", policy(v1.IPFamilyPolicyPreferDualStack)), "IPv6,IPv4", ""},
		{"SingleStack, IPv6 listed", dual, svc("s", policy(v1.IPFamilyPolicySingleStack, v1.IPv6Protocol)), "IPv6", ""},
		{"no policy, IPv6 listed", dual, svc("s", func(s *v1.Service) { s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol} }), "IPv6", ""},
		{"RequireDualStack names its IPv6 clusterIP", dual, svc("s", withIP("fd00:96::77"), policy(v1.IPFamilyPolicyRequireDualStack)), "fd00:96::77,IPv4", ""},
		{"PreferDualStack names its IPv4 clusterIP", dual, svc("s", withIP("10.96.3.3"), policy(v1.IPFamilyPolicyPreferDualStack)), "10.96.3.3,IPv6", ""},
		{"PreferDualStack names both", dual, svc("s", withIP("10.96.3.3", "fd00:96::77"), policy(v1.IPFamilyPolicyPreferDualStack)), "10.96.3.3,fd00:96::77", ""},
		{"SingleStack names its clusterIP", dual, svc("s", withIP("10.96.3.3"), policy(v1.IPFamilyPolicySingleStack)), "10.96.3.3", ""},
		{"PreferDualStack on a single-stack range", "10.96.0.0/16", svc("s", policy(v1.IPFamilyPolicyPreferDualStack, v1.IPv4Protocol)), "IPv4", ""},
		{"PreferDualStack names its clusterIP on a single-stack range", "10.96.0.0/16", svc("s", withIP("10.96.3.3"), policy(v1.IPFamilyPolicyPreferDualStack)), "10.96.3.3", ""},
		{"RequireDualStack on a single-stack range", "10.96.0.0/16", svc("s", policy(v1.IPFamilyPolicyRequireDualStack, v1.IPv4Protocol)), "",
			"Service default/s: spec.ipFamilyPolicy: RequireDualStack, but --service-cluster-ip-range 10.96.0.0/16 has one IP family"},
		{"RequireDualStack names its clusterIP on a single-stack range", "10.96.0.0/16", svc("s", withIP("10.96.3.3"), policy(v1.IPFamilyPolicyRequireDualStack)), "",
			"Service default/s: spec.ipFamilyPolicy: RequireDualStack, but --service-cluster-ip-range 10.96.0.0/16 has one IP family"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := newClusterIPAllocator(mustRange(t, tt.ranges))
			d := desiredOf(tt.svc)
			news, errs := a.assign(d, nil)
			if tt.wantErr != "" {
				if len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.wantErr) {
					t.Fatalf("errors %v, want one containing %q", errs, tt.wantErr)
				}
				if _, ok := d[objectKey{KindService, "default", "s"}]; ok {
					t.Error("the refused Service is still served")
				}
				return
			}
			if len(errs) > 0 {
				t.Fatalf("errors: %v", errs)
			}
			ips := clusterIPsOf(d, "s")
			var got []string
			for _, ip := range ips {
				a := netip.MustParseAddr(ip)
				switch {
				case slices.Contains(tt.svc.Spec.ClusterIPs, ip):
					got = append(got, ip)
				case !slices.ContainsFunc(mustRange(t, tt.ranges), func(p netip.Prefix) bool { return p.Contains(a) }):
					got = append(got, ip+" (outside the range)")
				case a.Is4():
					got = append(got, "IPv4")
				default:
					got = append(got, "IPv6")
				}
			}
			if strings.Join(got, ",") != tt.want {
				t.Errorf("clusterIPs %v: %s, want %s", ips, strings.Join(got, ","), tt.want)
			}
			if o := d[objectKey{KindService, "default", "s"}]; o.obj.(*v1.Service).Spec.ClusterIP != ips[0] {
				t.Errorf("clusterIP %s, clusterIPs %v", o.obj.(*v1.Service).Spec.ClusterIP, ips)
			}
			if named := tt.svc.Spec.ClusterIPs; len(named) == 1 && len(ips) == 2 {
				want := "Service default/s names clusterIP " + named[0] + ", and its ipFamilyPolicy asks for both IP families: allocated " + ips[1] + " from --service-cluster-ip-range "
				if len(news) != 1 || !strings.HasPrefix(news[0].String(), want) {
					t.Errorf("logged %v, want %q", news, want)
				}
			}
		})
	}
}

// Without a collision the address depends on namespace/name only, not on
// start order or other Services.
func TestClusterIPAllocationStable(t *testing.T) {
	r := mustRange(t, DefaultServiceClusterIPRange)
	alone := newClusterIPAllocator(r)
	d := desiredOf(svc("web"))
	alone.assign(d, nil)
	first := clusterIPsOf(d, "web")[0]
	crowd := newClusterIPAllocator(r)
	d = desiredOf(svc("a"), svc("web"), svc("z"))
	crowd.assign(d, nil)
	if got := clusterIPsOf(d, "web")[0]; got != first {
		t.Errorf("web got %s among others, %s alone", got, first)
	}
}

// reloadServices places the Services as a reload does, with served the
// Services the handler has, and returns what is served next.
func reloadServices(a *clusterIPAllocator, served map[objectKey]servedObject, svcs ...*v1.Service) (map[objectKey]servedObject, []error) {
	d := desiredOf(svcs...)
	_, errs := a.place(d, served)
	return d, errs
}

// firstIPs is each served Service's spec.clusterIP by name.
func firstIPs(d map[objectKey]servedObject) map[string]string {
	m := map[string]string{}
	for k, o := range d {
		m[k.Name] = o.obj.(*v1.Service).Spec.ClusterIP
	}
	return m
}

func svcsNamed(names ...string) []*v1.Service {
	out := make([]*v1.Service, len(names))
	for i, n := range names {
		out[i] = svc(n)
	}
	return out
}

// growing is the Services present after each of len(names) reloads that add
// one name at a time.
func growing(names ...string) [][]string {
	var steps [][]string
	for i := range names {
		steps = append(steps, names[:i+1])
	}
	return steps
}

// The address a Service is allocated depends on the set of Services present,
// not on the order they came in: after a restart with the same files every
// Service has the address it had. Two Services hashing to one slot used to
// swap addresses across a restart (the one added live first held the slot;
// at start the one whose name sorts first took it), so that clients of one
// reached the other.
func TestClusterIPAllocationSurvivesRestart(t *testing.T) {
	// In a /28 web and auth share a slot, and cache and api share another.
	eight := []string{"api", "auth", "cache", "db", "metrics", "queue", "search", "web"}
	reversed := slices.Clone(eight)
	slices.Reverse(reversed)
	tests := []struct {
		name   string
		ranges string
		steps  [][]string // the Services present after each reload, the first at start
	}{
		// app-4786 and app-3499 share a slot of the default range.
		{name: "one slot, app-4786 first", ranges: DefaultServiceClusterIPRange, steps: growing("app-4786", "app-3499")},
		{name: "one slot, app-3499 first", ranges: DefaultServiceClusterIPRange, steps: growing("app-3499", "app-4786")},
		{name: "a /28 filled in name order", ranges: "10.0.0.0/28", steps: growing(eight...)},
		{name: "a /28 filled in reverse name order", ranges: "10.0.0.0/28", steps: growing(reversed...)},
		{name: "a /28 emptied in name order", ranges: "10.0.0.0/28", steps: [][]string{eight, eight[1:], eight[2:], eight[3:]}},
		{name: "a /28 emptied in reverse name order", ranges: "10.0.0.0/28", steps: [][]string{eight, eight[:7], eight[:6], eight[:5]}},
		{name: "a /30 in both orders", ranges: "10.0.0.0/30", steps: [][]string{{"b"}, {"a", "b"}, {"a"}, {"a", "b"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustRange(t, tt.ranges)
			live := newClusterIPAllocator(r)
			served := map[objectKey]servedObject{}
			for _, step := range tt.steps {
				var errs []error
				if served, errs = reloadServices(&live, served, svcsNamed(step...)...); len(errs) > 0 {
					t.Fatalf("%v: %v", step, errs)
				}
			}
			restarted := newClusterIPAllocator(r)
			after, errs := reloadServices(&restarted, map[objectKey]servedObject{}, svcsNamed(tt.steps[len(tt.steps)-1]...)...)
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			before, now := firstIPs(served), firstIPs(after)
			moved := 0
			for name, ip := range before {
				if now[name] != ip {
					t.Errorf("%s: %s before the restart, %s after", name, ip, now[name])
					moved++
				}
			}
			if moved > 0 {
				t.Errorf("%d of %d Services changed address across a restart with the same files", moved, len(before))
			}
		})
	}
}

// A file that names the address a running Service was allocated is refused
// with an error naming both, as kube-apiserver refuses an address it has
// allocated ("provided IP is already allocated"), and the running Service
// keeps it; everything else keeps serving. It used to take the address, and
// the running Service was silently moved, or dropped when the range was full.
// At start, with nothing running, the address a file names wins.
func TestClusterIPNamedAfterAllocation(t *testing.T) {
	tests := []struct {
		name    string
		ranges  string
		start   []*v1.Service
		next    func(ip map[string]string) []*v1.Service // ip: the addresses after start
		want    func(ip map[string]string) map[string]string
		wantErr func(ip map[string]string) string
	}{
		{name: "a new Service names a running one's address", ranges: "10.200.0.0/24",
			start: svcsNamed("s1", "s2", "s3"),
			next: func(ip map[string]string) []*v1.Service {
				return append(svcsNamed("s1", "s2", "s3"), svc("fixed", withIP(ip["s1"])))
			},
			want: func(ip map[string]string) map[string]string { return ip },
			wantErr: func(ip map[string]string) string {
				return "Service default/fixed: spec.clusterIP: clusterIP " + ip["s1"] + " is already used by Service default/s1 (svc.yaml document 1), allocated to it from --service-cluster-ip-range"
			}},
		{name: "the range is full", ranges: "10.0.0.0/30",
			start: svcsNamed("s1", "s2"),
			next: func(ip map[string]string) []*v1.Service {
				return append(svcsNamed("s1", "s2"), svc("fixed", withIP(ip["s2"])))
			},
			want: func(ip map[string]string) map[string]string { return ip },
			wantErr: func(ip map[string]string) string {
				return "Service default/fixed: spec.clusterIP: clusterIP " + ip["s2"] + " is already used by Service default/s2 (svc.yaml document 1), allocated to it from --service-cluster-ip-range"
			}},
		{name: "a running Service edited to name another's address keeps its last good version", ranges: "10.200.0.0/24",
			start: []*v1.Service{svc("s1"), svc("fixed", withIP("10.200.0.250"))},
			next: func(ip map[string]string) []*v1.Service {
				return []*v1.Service{svc("s1"), svc("fixed", withIP(ip["s1"]))}
			},
			want: func(ip map[string]string) map[string]string { return ip },
			wantErr: func(ip map[string]string) string {
				return "Service default/fixed: spec.clusterIP: clusterIP " + ip["s1"] + " is already used by Service default/s1 (svc.yaml document 1), allocated to it from --service-cluster-ip-range"
			}},
		{name: "at start the named address wins", ranges: "10.200.0.0/24",
			start: svcsNamed("s1"),
			next: func(ip map[string]string) []*v1.Service {
				return []*v1.Service{svc("s1"), svc("fixed", withIP(ip["s1"]))}
			},
			want: func(ip map[string]string) map[string]string {
				return map[string]string{"fixed": ip["s1"], "s1": "another"}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustRange(t, tt.ranges)
			a := newClusterIPAllocator(r)
			served, errs := reloadServices(&a, map[objectKey]servedObject{}, tt.start...)
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			ip := firstIPs(served)
			if tt.wantErr == nil {
				// A fresh start with the next files.
				a, served = newClusterIPAllocator(r), map[objectKey]servedObject{}
			}
			next, errs := reloadServices(&a, served, tt.next(ip)...)
			got, want := firstIPs(next), tt.want(ip)
			for name, w := range want {
				if w == "another" {
					if got[name] == "" || got[name] == ip[name] {
						t.Errorf("%s: %q, want an address other than %s", name, got[name], ip[name])
					}
				} else if got[name] != w {
					t.Errorf("%s: %q, want %q", name, got[name], w)
				}
			}
			if len(got) != len(want) {
				t.Errorf("served %v, want %v", got, want)
			}
			var wantErr string
			if tt.wantErr != nil {
				wantErr = tt.wantErr(ip)
			}
			if wantErr == "" && len(errs) > 0 || wantErr != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), wantErr)) {
				t.Errorf("errors %v, want %q", errs, wantErr)
			}
		})
	}
}

// A live add that moves a running Service (the newcomer ranks before it for
// its slot) is logged with the address it had; the unmoved are not logged.
func TestClusterIPMoveIsLogged(t *testing.T) {
	a := newClusterIPAllocator(mustRange(t, "10.0.0.0/28"))
	// In a /28 web and auth share a slot, and auth's hash is the lower.
	served, errs := reloadServices(&a, map[objectKey]servedObject{}, svc("web"), svc("db"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	was := clusterIPsOf(served, "web")[0]
	d := desiredOf(svc("web"), svc("db"), svc("auth"))
	news, errs := a.place(d, served)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var got []string
	for _, n := range news {
		got = append(got, n.String())
	}
	want := []string{
		"Service default/auth has no clusterIP: allocated " + was + " from --service-cluster-ip-range 10.0.0.0/28",
		"Service default/web has no clusterIP: allocated " + clusterIPsOf(d, "web")[0] + " from --service-cluster-ip-range 10.0.0.0/28 " +
			"(moved from " + was + ": the Services allocated from the range changed)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("logged\n%q\nwant\n%q", got, want)
	}
}
