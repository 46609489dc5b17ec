package proxier

import (
	"net/netip"
	"sync"

	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// endpointsTracker turns EndpointSlices into per-service-port endpoint lists
// and hands them to the balancer at once: endpoint changes never wait for a
// sync and never touch iptables (the seed-004 rollout failed because they did).
type endpointsTracker struct {
	lb *loadbalancer.LoadBalancer

	mu sync.Mutex
	// slices of each Service, by slice name.
	slices map[types.NamespacedName]map[string]*discovery.EndpointSlice
	// portNames remembers which service ports had endpoints, so that a port
	// that disappears from every slice is emptied in the balancer.
	portNames map[types.NamespacedName]map[loadbalancer.ServicePortName]bool
	onChange  func(changed bool)
}

func newEndpointsTracker(lb *loadbalancer.LoadBalancer, onChange func(changed bool)) *endpointsTracker {
	return &endpointsTracker{
		lb:        lb,
		slices:    map[types.NamespacedName]map[string]*discovery.EndpointSlice{},
		portNames: map[types.NamespacedName]map[loadbalancer.ServicePortName]bool{},
		onChange:  onChange,
	}
}

func serviceOf(es *discovery.EndpointSlice) (types.NamespacedName, bool) {
	name := es.Labels[discovery.LabelServiceName]
	if name == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: es.Namespace, Name: name}, true
}

// update records es (or its removal when deleted) and re-applies the
// endpoints of its Service.
func (t *endpointsTracker) update(es *discovery.EndpointSlice, deleted bool) {
	svc, ok := serviceOf(es)
	if !ok {
		return
	}
	if es.AddressType == discovery.AddressTypeFQDN {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	bySlice := t.slices[svc]
	if deleted {
		delete(bySlice, es.Name)
		if len(bySlice) == 0 {
			delete(t.slices, svc)
		}
	} else {
		if bySlice == nil {
			bySlice = map[string]*discovery.EndpointSlice{}
			t.slices[svc] = bySlice
		}
		bySlice[es.Name] = es
	}
	changed := t.apply(svc)
	if t.onChange != nil {
		t.onChange(changed)
	}
}

// apply merges every slice of svc into endpoint lists per service port.
func (t *endpointsTracker) apply(svc types.NamespacedName) bool {
	byPort := map[loadbalancer.ServicePortName][]loadbalancer.Endpoint{}
	for _, es := range t.slices[svc] {
		for _, p := range es.Ports {
			if p.Port == nil {
				continue
			}
			spn := loadbalancer.ServicePortName{NamespacedName: svc}
			if p.Name != nil {
				spn.Port = *p.Name
			}
			spn.Protocol = "TCP"
			if p.Protocol != nil {
				spn.Protocol = *p.Protocol
			}
			for _, ep := range es.Endpoints {
				e := endpointFromSlice(ep)
				for _, addr := range ep.Addresses {
					a, err := netip.ParseAddr(addr)
					if err != nil {
						continue
					}
					e.Addr = netip.AddrPortFrom(a.Unmap(), uint16(*p.Port))
					byPort[spn] = append(byPort[spn], e)
				}
			}
		}
	}
	changed := false
	for spn := range t.portNames[svc] {
		if _, ok := byPort[spn]; !ok {
			changed = t.lb.SetEndpoints(spn, nil) || changed
		}
	}
	names := make(map[loadbalancer.ServicePortName]bool, len(byPort))
	for spn, eps := range byPort {
		names[spn] = true
		changed = t.lb.SetEndpoints(spn, dedupe(eps)) || changed
	}
	if len(names) == 0 {
		delete(t.portNames, svc)
	} else {
		t.portNames[svc] = names
	}
	return changed
}

func endpointFromSlice(ep discovery.Endpoint) loadbalancer.Endpoint {
	// Nil conditions mean "unknown"; the API says to treat them as ready/serving.
	ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
	serving := ready
	if ep.Conditions.Serving != nil {
		serving = *ep.Conditions.Serving
	}
	terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
	e := loadbalancer.Endpoint{Ready: ready, Serving: serving, Terminating: terminating}
	if ep.NodeName != nil {
		e.NodeName = *ep.NodeName
	}
	if ep.Zone != nil {
		e.Zone = *ep.Zone
	}
	return e
}

// dedupe drops the same address listed by two slices (it happens briefly
// while an endpoint moves between slices), keeping the first.
func dedupe(eps []loadbalancer.Endpoint) []loadbalancer.Endpoint {
	seen := make(map[netip.AddrPort]bool, len(eps))
	out := eps[:0]
	for _, e := range eps {
		if !seen[e.Addr] {
			seen[e.Addr] = true
			out = append(out, e)
		}
	}
	return out
}
