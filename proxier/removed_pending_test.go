package proxier

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// A Service deleted while its retired second socket (externalTrafficPolicy
// Local -> Cluster) waits for a rule write that keeps failing goes with
// it, as its service port's own socket does at that sync: it served the
// deleted Service's endpoints as they were at the deletion (its balancer
// entry, no longer in the balancer, took no update), and after a
// re-creation under the same name the NodePort's clients of the kernel's
// old rules still met the deleted Service's endpoints, not the new one's,
// until a write succeeded.
func TestRetiredExternalSocketGoesWithItsDeletedService(t *testing.T) {
	startUDPEcho(t, "127.0.0.2:20057", "old:")
	startUDPEcho(t, "127.0.0.3:20057", "new:")
	fake := iptables.NewFakeRunner(iptables.IPv4)
	rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.0.2.2")})
	p := newTestProxier(t, Options{NodeName: "node1", IPv4Portals: rules})
	local := makeService("web", withProtocol(v1.ProtocolUDP), withNodePort(30057), func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	es := makeSlice("web", v1.ProtocolUDP, "127.0.0.2:20057")
	es.Endpoints[0].NodeName = ptr.To("node1")
	p.OnServiceAdd(local)
	p.OnEndpointSliceAdd(es)
	p.Sync()
	name := p.lbName("default/web:p")
	ap := p.active[name]
	if ap == nil || ap.external == nil {
		t.Fatal("no second socket under externalTrafficPolicy Local")
	}
	extPort := ap.externalPort
	ask := func(port int) (string, error) {
		return askUDP(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), "q", 5*time.Second)
	}

	fake.SetError("Restore", errors.New("iptables-restore: line 3 failed"))
	cluster := makeService("web", withProtocol(v1.ProtocolUDP), withNodePort(30057))
	p.OnServiceUpdate(local, cluster)
	p.Sync()
	if _, err := ask(extPort); err != nil {
		t.Fatalf("the retired second socket (port %d) after a failed write: %v, want an answer (test set-up)", extPort, err)
	}

	// The Service deleted, its slice not yet (the EndpointSlice
	// controller's garbage collection follows).
	p.OnServiceDelete(cluster)
	p.Sync()
	if got, err := ask(extPort); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the deleted Service's retired socket (port %d): %q, %v; want it closed with the Service's own socket (ECONNREFUSED)", extPort, got, err)
	}
	if p.ports.handedOut(extPort) {
		t.Errorf("the deleted Service's retired socket's port %d is still held", extPort)
	}
	if _, ok := p.lb.Snapshot(externalName(name)); ok {
		t.Errorf("the deleted Service's second balancer entry is still there")
	}

	// Re-created, other endpoints, the writes still failing: nothing of
	// the deleted one answers for it.
	es2 := makeSlice("web", v1.ProtocolUDP, "127.0.0.3:20057")
	p.OnEndpointSliceUpdate(es, es2)
	p.OnServiceAdd(cluster)
	p.Sync()
	if got, err := ask(extPort); err == nil && p.active[name].proxyPort != extPort {
		t.Errorf("the deleted Service's retired socket (port %d) answered %q for the re-created one", extPort, got)
	}
	fake.SetError("Restore", nil)
	p.Sync()
	if got, err := ask(p.active[name].proxyPort); err != nil || got != "new:q" {
		t.Errorf("the re-created Service: %q, %v; want new:q", got, err)
	}
	if len(p.retired) != 0 {
		t.Errorf("retired sockets left: %d", len(p.retired))
	}
}

// A UDP service port deleted while every family's rule write fails takes
// its pending clearing and its traffic-policy move record with it (its
// destinations are cleared as a closed port's): kept, a Service re-created
// under the same name before a write succeeded had its first clearing
// judged against the deleted one's proxy ports, as if its policy had
// changed, and spared both new sockets at its NodePort, where a new
// externalTrafficPolicy Local port spares only the one its rules send
// other hosts' clients to.
func TestDeletedServicesPolicyMoveNotInheritedByItsRecreation(t *testing.T) {
	ct := &flowRecorder{}
	v4 := &switchSyncer{}
	p := newTestProxier(t, Options{IPv4Portals: v4, Conntrack: ct})
	itpLocal := v1.ServiceInternalTrafficPolicyLocal
	etpLocal := func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }
	first := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053), etpLocal)
	p.OnServiceAdd(first)
	p.Sync()
	udpDNSWithExternalSocket(t, p)

	v4.failing.Store(true)
	bothLocal := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053), etpLocal, func(s *v1.Service) {
		s.Spec.InternalTrafficPolicy = &itpLocal
	})
	p.OnServiceUpdate(first, bothLocal)
	p.Sync()
	p.OnServiceDelete(bothLocal)
	p.Sync()
	again := makeService("dns", withProtocol(v1.ProtocolUDP), withNodePort(30053), etpLocal)
	p.OnServiceAdd(again)
	p.Sync()
	ap := udpDNSWithExternalSocket(t, p)
	ct.flows = nil
	v4.failing.Store(false)
	p.Sync()
	spared, ok := ct.sparedAt(netip.AddrPortFrom(netip.Addr{}, 30053))
	if !ok {
		t.Fatalf("cleared %v, want the NodePort's entries", ct.flows)
	}
	if want := []int{ap.externalPort}; !slices.Equal(spared, want) {
		t.Errorf("the re-created Service's NodePort clearing spared %v, want %v (its external socket only, as a new Service's; cluster IP's socket %d)",
			spared, want, ap.proxyPort)
	}
}

// flowRecorder records every flow cleared.
type flowRecorder struct{ flows []StaleFlows }

func (f *flowRecorder) ClearStale(flows []StaleFlows) error {
	f.flows = append(f.flows, flows...)
	return nil
}

// sparedAt is what the clearings of dst spared together: each clears the
// entries NATed to a port not in its Live, so the ports all of them name.
func (f *flowRecorder) sparedAt(dst netip.AddrPort) ([]int, bool) {
	var spared []int
	found := false
	for _, fl := range f.flows {
		if fl.Protocol != v1.ProtocolUDP || fl.Dst != dst {
			continue
		}
		if !found {
			spared, found = slices.Clone(fl.Live), true
			continue
		}
		spared = slices.DeleteFunc(spared, func(port int) bool { return !slices.Contains(fl.Live, port) })
	}
	slices.Sort(spared)
	return spared, found
}
