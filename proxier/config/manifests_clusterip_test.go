package config

import (
	"fmt"
	"net/netip"
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
		{name: "full range", ranges: "10.0.0.0/30", svcs: []*v1.Service{svc("a"), svc("b"), svc("c")}, wantErr: "Service default/c: spec.clusterIP: not set, and --service-cluster-ip-range 10.0.0.0/30 is full"},
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
			_, errs := a.assign(d)
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

// The address depends on namespace/name only, not on start order or other
// Services; a Service keeps its address while it exists, even when one
// added later hashes to the same slot.
func TestClusterIPAllocationStable(t *testing.T) {
	r := mustRange(t, DefaultServiceClusterIPRange)
	alone := newClusterIPAllocator(r)
	d := desiredOf(svc("web"))
	alone.assign(d)
	first := clusterIPsOf(d, "web")[0]
	crowd := newClusterIPAllocator(r)
	d = desiredOf(svc("a"), svc("web"), svc("z"))
	crowd.assign(d)
	if got := clusterIPsOf(d, "web")[0]; got != first {
		t.Errorf("web got %s among others, %s alone", got, first)
	}

	// In a /30 two names share a slot half the time: find a pair whose
	// second sorts first, so that a fresh allocation would give the first
	// one's address to the newcomer.
	small := mustRange(t, "10.0.0.0/30")
	slot := func(name string) string {
		ips, _ := allocate(objectKey{KindService, "default", name}, small, map[netip.Addr]bool{})
		return ips[0].String()
	}
	holder := "svc-z"
	var newcomer string
	for i := range 100 {
		if n := fmt.Sprintf("svc-a%d", i); slot(n) == slot(holder) {
			newcomer = n
			break
		}
	}
	if newcomer == "" {
		t.Fatal("no colliding pair found")
	}
	a := newClusterIPAllocator(small)
	d = desiredOf(svc(holder))
	a.assign(d)
	held := clusterIPsOf(d, holder)[0]
	d = desiredOf(svc(holder), svc(newcomer))
	news, errs := a.assign(d)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := clusterIPsOf(d, holder)[0]; got != held {
		t.Errorf("%s moved from %s to %s when %s was added", holder, held, got, newcomer)
	}
	if len(news) != 1 || news[0].key.Name != newcomer || clusterIPsOf(d, newcomer)[0] == held {
		t.Errorf("newcomer allocation %v, addresses %v", news, clusterIPsOf(d, newcomer))
	}
	// An explicit clusterIP that claims the held address moves the holder.
	d = desiredOf(svc(holder), svc("pinned", withIP(held)))
	if _, errs := a.assign(d); len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := clusterIPsOf(d, holder)[0]; got == held {
		t.Errorf("%s kept %s, which pinned names explicitly", holder, got)
	}
}
