package proxier

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

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
