package proxier

import (
	"slices"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// switchSyncer is a PortalSyncer whose writes fail while failing is set.
type switchSyncer struct{ failing atomic.Bool }

func (s *switchSyncer) Sync(p []iptables.Portal) error {
	if s.failing.Load() {
		return failSyncer{}.Sync(p)
	}
	return nil
}

// failingRules are rules whose every write fails while fail is set, with
// or without a change to write.
type failingRules struct {
	*iptables.Rules
	fail *atomic.Bool
}

func (r failingRules) Sync(p []iptables.Portal) error {
	if r.fail.Load() {
		return failSyncer{}.Sync(p)
	}
	return r.Rules.Sync(p)
}

func (r failingRules) Update(p []iptables.Portal) error {
	if r.fail.Load() {
		return failSyncer{}.Sync(p)
	}
	return r.Rules.Update(p)
}

// Each family's stale UDP entries are cleared once that family's rules are
// written, as kube-proxy's per-family proxiers each clear their own: while
// ip6tables-restore kept failing, the IPv4 entries of a changed dual-stack
// UDP Service were not cleared either, so an IPv4 client that keeps its
// source port (a resolver) stayed on a dead proxy port until IPv6 recovered.
// The failed family's entries wait for its rules, then are cleared.
func TestStaleFlowsClearedPerFamily(t *testing.T) {
	ct := &fakeConntrack{}
	v6 := &switchSyncer{}
	v6.failing.Store(true)
	p := newTestProxier(t, Options{IPv4Portals: okSyncer{}, IPv6Portals: v6, Conntrack: ct})
	dualStack := func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }
	svc := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053), dualStack)
	p.OnServiceAdd(svc)
	p.Sync()
	// The IPv4 ClusterIP and the NodePort on IPv4 addresses (0.0.0.0):
	// their rules are in.
	want := []string{"udp 0.0.0.0:30053", "udp 10.96.0.10:80"}
	if got := ct.take(); !slices.Equal(got, want) {
		t.Fatalf("with IPv6's rules failing, cleared %v, want IPv4's %v", got, want)
	}
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a second sync with IPv6 still failing cleared %v again", got)
	}
	// A removed UDP Service: its IPv4 destinations go at once too.
	p.OnServiceDelete(svc)
	p.Sync()
	if got := ct.take(); !slices.Equal(got, want) {
		t.Fatalf("with IPv6's rules failing, the removed Service's cleared %v, want IPv4's %v", got, want)
	}
	v6.failing.Store(false)
	p.Sync()
	// IPv6's, kept for its first write: the new socket's and the removed
	// Service's destinations alike.
	want = []string{"udp :::30053", "udp fd00::10:80"}
	if got := ct.take(); !slices.Equal(got, want) {
		t.Fatalf("once IPv6's rules were written, cleared %v, want IPv6's %v", got, want)
	}
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a sync after both were cleared cleared %v again", got)
	}
}

// A served port's entries of the family whose write failed wait for that
// family's write, and are cleared then: the Service is not removed in
// between (whose closed destinations would be cleared anyway), so only the
// pending port's own families carry them.
func TestStaleFlowsOfAServedPortWaitForTheirFamily(t *testing.T) {
	ct := &fakeConntrack{}
	v6 := &switchSyncer{}
	v6.failing.Store(true)
	p := newTestProxier(t, Options{IPv4Portals: okSyncer{}, IPv6Portals: v6, Conntrack: ct})
	dualStack := func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053), dualStack))
	p.Sync()
	if got, want := ct.take(), []string{"udp 0.0.0.0:30053", "udp 10.96.0.10:80"}; !slices.Equal(got, want) {
		t.Fatalf("with IPv6's rules failing, cleared %v, want IPv4's %v", got, want)
	}
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a second sync with IPv6 still failing cleared %v", got)
	}
	v6.failing.Store(false)
	p.Sync()
	if got, want := ct.take(), []string{"udp :::30053", "udp fd00::10:80"}; !slices.Equal(got, want) {
		t.Fatalf("once IPv6's rules were written, cleared %v, want IPv6's %v (kept for its write)", got, want)
	}
	p.Sync()
	if got := ct.take(); len(got) != 0 {
		t.Fatalf("a sync after both were cleared cleared %v again", got)
	}
}

// A traffic policy changed twice while one family's rule write fails is
// cleared in the other family against the rules that family had before
// the second change, not the first: IPv4's rules moved clients at each
// change. ETP Local to both Local and back moves every client between the
// two sockets each time; judged against the first rules (those of ETP
// Local again), IPv4's second clearing spared both sockets at the
// NodePort, so an IPv4 client keeping its source port that both Local had
// NATed to the cluster IP's socket (then node-local) stayed there, now
// every node's endpoints under ETP Local, and a pod on the other socket,
// now node-local. IPv6's entries, whose rules never left the first
// policy's, are judged against those.
func TestPolicyChangedTwiceWhileAFamilyFails(t *testing.T) {
	ct := &fakeConntrack{}
	v6 := &switchSyncer{}
	p := newTestProxier(t, Options{IPv4Portals: okSyncer{}, IPv6Portals: v6, Conntrack: ct})
	local := v1.ServiceInternalTrafficPolicyLocal
	policy := func(itp bool) *v1.Service {
		return makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053), func(s *v1.Service) {
			s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			if itp {
				s.Spec.InternalTrafficPolicy = &local
			}
		})
	}
	old := policy(false)
	p.OnServiceAdd(old)
	p.Sync()
	ap := udpDNSWithExternalSocket(t, p)
	cluster, external := ap.proxyPort, ap.externalPort
	v6.failing.Store(true)
	for _, step := range []struct {
		name string
		itp  bool
	}{{"ETP Local to both Local", true}, {"both Local to ETP Local", false}} {
		ct.take()
		svc := policy(step.itp)
		p.OnServiceUpdate(old, svc)
		old = svc
		p.Sync()
		if got := ct.take(); !slices.Contains(got, "udp 0.0.0.0:30053") {
			t.Fatalf("%s: cleared %v, want the IPv4 NodePort's entries", step.name, got)
		}
		if spared := ct.spared["0.0.0.0:30053"]; len(spared) != 0 {
			t.Errorf("%s: the IPv4 NodePort's clearing spared %v, want none: every client moved (cluster IP's socket %d, external %d)",
				step.name, spared, cluster, external)
		}
	}
	// IPv6's rules are written at last, still ETP Local's first ones: the
	// policy is that again, so no client of the IPv6 rules moved.
	v6.failing.Store(false)
	p.Sync()
	if got := ct.take(); !slices.Contains(got, "udp :::30053") {
		t.Fatalf("once IPv6's rules were written, cleared %v, want the IPv6 NodePort's entries", got)
	}
	if spared := ct.spared[":::30053"]; !slices.Equal(spared, []int{cluster, external}) {
		t.Errorf("the IPv6 NodePort's clearing spared %v, want both sockets %v: its rules never left ETP Local's", spared, []int{cluster, external})
	}
	if len(p.policyMoved) != 0 {
		t.Errorf("moves kept after both families' clearing: %v", p.policyMoved)
	}
}
