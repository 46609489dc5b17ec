package proxier

import (
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// endpointsTracker turns EndpointSlices into per-service-port endpoint lists
// and hands them to the balancer at once: endpoint changes never wait for a
// sync and never touch iptables (the seed-004 rollout failed because they did).
type endpointsTracker struct {
	lb      *loadbalancer.LoadBalancer
	clk     clock.PassiveClock
	metrics *Metrics
	// started is when the tracker began: a change triggered before it is
	// not this process's programming latency (observeProgramming).
	started time.Time
	// nodeFamilies are the IP families this node serves (0: both): the
	// slices of another address type are no endpoint change of its, as
	// kube-proxy runs no proxier of that family there. Set before the
	// first event.
	nodeFamilies ipFamilies

	mu sync.Mutex
	// slices of each Service, by slice name.
	slices map[types.NamespacedName]map[string]*discovery.EndpointSlice
	// fqdn names each Service's FQDN slices, which give no endpoint (as
	// kube-proxy's): kept only for explain to say that they name it.
	fqdn map[types.NamespacedName]map[string]bool
	// applied remembers which balancer entries got endpoints, so that a port
	// that disappears from every slice is emptied in the balancer.
	applied  map[types.NamespacedName]map[loadbalancer.ServicePortName]bool
	policies map[types.NamespacedName]trafficPolicy
	// families holds the IP family of each Service served in one family
	// on this node (setFamilies: a single-stack Service, or a dual-stack
	// one on a node serving one family): only its slices of that address
	// type give it endpoints. A Service not in it takes every slice.
	families map[types.NamespacedName]ipFamilies
	// local counts each Service's ready node-local pods per family
	// (loadbalancer.Family's index), for the healthCheckNodePort server.
	local map[types.NamespacedName][2]int
	// noLocal counts each Service's ports with a Local policy whose usable
	// endpoints are all elsewhere (internal, external), and noLocalTotal
	// their sums: kubeproxy_sync_proxy_rules_no_local_endpoints_total.
	noLocal      map[types.NamespacedName]noLocalPorts
	noLocalTotal noLocalPorts
	node         nodeTopology
	// changed, if set, is told (under mu) of a Service whose eligible
	// endpoints changed: connections to removed ones may drain.
	changed func(types.NamespacedName)
	// open holds the service ports with a proxy socket whose rules a
	// sync wrote (setOpen), with the families it wrote them in; a change
	// to a port not open yet in its slice's family waits in pending
	// (observeProgramming).
	open    map[loadbalancer.ServicePortName]ipFamilies
	pending map[types.NamespacedName][]pendingTrigger
	// batches counts the batches of events open (beginBatch). While one
	// is, a slice event records the slice and marks its Service dirty;
	// endBatch applies each dirty Service once and then observes the
	// batches' trigger times (batched). Applied at each event, a
	// Service given its endpoints in N slices merged them all N times:
	// 5,000 one-endpoint slices of one Service took 19 s of CPU to load.
	batches int
	dirty   map[types.NamespacedName]bool
	batched []sliceTrigger
}

// sliceTrigger is a slice added or updated in a batch, with the version
// it replaced (nil: none), for observeProgramming at the batch's end.
type sliceTrigger struct {
	svc     types.NamespacedName
	es, old *discovery.EndpointSlice
}

// pendingTrigger is a slice change's trigger time that waits for its
// ports' proxy sockets.
type pendingTrigger struct {
	at     time.Time
	family string // the slice's, the ip_family it is recorded under
	ports  []loadbalancer.ServicePortName
}

// maxPendingTriggers bounds the trigger times kept for a Service not
// served yet (slices of a Service that never comes must not grow it).
const maxPendingTriggers = 8

func newEndpointsTracker(lb *loadbalancer.LoadBalancer, clk clock.PassiveClock, m *Metrics, node nodeTopology) *endpointsTracker {
	return &endpointsTracker{
		lb:       lb,
		clk:      clk,
		metrics:  m,
		started:  clk.Now(),
		slices:   map[types.NamespacedName]map[string]*discovery.EndpointSlice{},
		applied:  map[types.NamespacedName]map[loadbalancer.ServicePortName]bool{},
		policies: map[types.NamespacedName]trafficPolicy{},
		families: map[types.NamespacedName]ipFamilies{},
		local:    map[types.NamespacedName][2]int{},
		noLocal:  map[types.NamespacedName]noLocalPorts{},
		node:     node,
		open:     map[loadbalancer.ServicePortName]ipFamilies{},
		pending:  map[types.NamespacedName][]pendingTrigger{},
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
// endpoints of its Service. As kube-proxy's EndpointsChangeTracker
// (EndpointSliceUpdate), every add, update and delete of a slice of an
// address type this node serves that names its Service is an endpoint
// change (kubeproxy_sync_proxy_rules_endpoint_changes_total), whatever it
// does to the endpoints served, and the trigger time of a slice added or
// updated is observed when its content changed (esDataChanged: the same
// object again is no new trigger). Counted only where the balancer
// changed, an update that added a not-ready endpoint, or turned a
// serving-terminating fallback endpoint ready, counted nothing and
// observed nothing.
func (t *endpointsTracker) update(es *discovery.EndpointSlice, deleted bool) {
	t.change(es, deleted, true)
}

// forget takes es away from the Service it names without counting an
// event: the slice was relabelled to another Service, and that update is
// counted as the new Service's.
func (t *endpointsTracker) forget(es *discovery.EndpointSlice) {
	t.change(es, true, false)
}

func (t *endpointsTracker) change(es *discovery.EndpointSlice, deleted, event bool) {
	svc, ok := serviceOf(es)
	if !ok {
		return
	}
	if es.AddressType == discovery.AddressTypeFQDN {
		// No endpoint of ours, and no event (kube-proxy's trackers take
		// IP slices only). A slice of that name that was an IP one (a
		// manifest edited: the API server keeps addressType immutable)
		// gives none any more: it is taken away, as deleted.
		t.mu.Lock()
		t.noteFQDN(svc, es.Name, deleted)
		_, had := t.slices[svc][es.Name]
		t.mu.Unlock()
		if !had {
			return
		}
		deleted, event = true, false
	}
	event = event && t.nodeFamilies.served(es.AddressType)
	if event {
		t.metrics.EndpointChangesTotal.Inc()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if es.AddressType != discovery.AddressTypeFQDN {
		t.noteFQDN(svc, es.Name, true) // an IP slice (again) under that name
	}
	bySlice := t.slices[svc]
	var old *discovery.EndpointSlice
	if deleted {
		delete(bySlice, es.Name)
		if len(bySlice) == 0 {
			delete(t.slices, svc)
			delete(t.pending, svc)
		}
	} else {
		if bySlice == nil {
			bySlice = map[string]*discovery.EndpointSlice{}
			t.slices[svc] = bySlice
		}
		old = bySlice[es.Name]
		bySlice[es.Name] = es
	}
	if t.batches > 0 {
		if t.dirty == nil {
			t.dirty = map[types.NamespacedName]bool{}
		}
		t.dirty[svc] = true
		if event && !deleted {
			t.batched = append(t.batched, sliceTrigger{svc: svc, es: es, old: old})
		}
		return
	}
	t.apply(svc)
	if event && !deleted {
		t.observeProgramming(svc, es, old)
	}
}

// beginBatch opens a batch of events (config.Batcher): until the last
// batch open ends, slice events only record the slices.
func (t *endpointsTracker) beginBatch() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.batches++
}

// endBatch ends a batch and applies each Service the events of the
// batches open changed, once, then observes their trigger times, as each
// event would have after its own apply: the endpoints are served now.
// At every end, not only the last one open's: two sources' batches
// overlap (the last known state's, served as its grace ran out, inside
// the informer's initial list), and the file's slices waited for the end
// of the list, its Services served with no endpoint meanwhile; a batch
// still open records on. A trigger of a Service left without slices is
// not observed (as the deletion of its last slice dropped the trigger
// times waiting for it).
func (t *endpointsTracker) endBatch() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.batches == 0 {
		return
	}
	t.batches--
	for svc := range t.dirty {
		t.apply(svc)
	}
	clear(t.dirty)
	for _, tr := range t.batched {
		if t.slices[tr.svc] != nil {
			t.observeProgramming(tr.svc, tr.es, tr.old)
		}
	}
	t.batched = nil
}

// noteFQDN records that the FQDN slice name names svc, or no longer does
// (gone). Called with mu held.
func (t *endpointsTracker) noteFQDN(svc types.NamespacedName, name string, gone bool) {
	names := t.fqdn[svc]
	if gone {
		delete(names, name)
		if len(names) == 0 {
			delete(t.fqdn, svc)
		}
		return
	}
	if names == nil {
		if t.fqdn == nil {
			t.fqdn = map[types.NamespacedName]map[string]bool{}
		}
		names = map[string]bool{}
		t.fqdn[svc] = names
	}
	names[name] = true
}

// sliceChanged reports whether es differs from old, the version of the
// slice last seen (nil: none), as kube-proxy's esDataChanged compares them
// (reflect.DeepEqual, which a new resourceVersion ends at once).
func sliceChanged(old, es *discovery.EndpointSlice) bool {
	switch {
	case old == nil:
		return true
	case old == es:
		return false
	case old.ResourceVersion != "" && es.ResourceVersion != "" && old.ResourceVersion != es.ResourceVersion:
		return true
	}
	return !reflect.DeepEqual(old, es)
}

// observeProgramming records how long the change took from its trigger
// (the EndpointSlice annotation the endpoints controller sets) until it
// was served: once the balancer has it when the slice's ports have their
// proxy sockets (endpoint changes touch nothing else), else at the sync
// that opens them (setOpen). Taken at the balancer always, a new
// Service's slice was recorded as programmed while nothing served it yet
// (about 2.0 s against 3.0 s from trigger to served, three Services
// created back to back). Ports this proxy carries no socket for (SCTP)
// wait for nothing; a change to a port that never opens (a slice of a
// port the Service renamed) is never served, and not recorded. As
// kube-proxy, only for a slice added or updated (a deleted slice's
// trigger time is its last change, not the deletion) and only for a
// trigger after this process started: at a restart every existing slice
// was observed with its age (3.75 days in one audit); and only when es
// differs from old, the slice's previous version (nil: none), as
// kube-proxy records a trigger time only for a slice whose data changed.
// Called with mu held.
func (t *endpointsTracker) observeProgramming(svc types.NamespacedName, es, old *discovery.EndpointSlice) {
	v, ok := es.Annotations[endpointsTriggerTimeAnnotation]
	if !ok {
		return
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	// Compared last: a slice without a trigger time costs nothing more.
	if err != nil || !at.After(t.started) || !sliceChanged(old, es) {
		return
	}
	family := sliceFamily(es)
	var waiting []loadbalancer.ServicePortName
	for _, spn := range slicePorts(svc, es) {
		if !t.isOpen(spn, family) {
			waiting = append(waiting, spn)
		}
	}
	if len(waiting) == 0 {
		t.observeSince(at, family)
		return
	}
	if len(t.pending[svc]) < maxPendingTriggers {
		t.pending[svc] = append(t.pending[svc], pendingTrigger{at: at, family: family, ports: waiting})
	}
}

// slicePorts are the service ports a slice gives endpoints to that this
// proxy opens a socket for (TCP and UDP).
func slicePorts(svc types.NamespacedName, es *discovery.EndpointSlice) []loadbalancer.ServicePortName {
	var out []loadbalancer.ServicePortName
	for _, p := range es.Ports {
		if spn := slicePortName(svc, p); spn.Protocol == v1.ProtocolTCP || spn.Protocol == v1.ProtocolUDP {
			out = append(out, spn)
		}
	}
	return out
}

// slicePortName is the service port a slice's port gives endpoints to:
// its name and protocol (TCP when unset).
func slicePortName(svc types.NamespacedName, p discovery.EndpointPort) loadbalancer.ServicePortName {
	spn := loadbalancer.ServicePortName{NamespacedName: svc, Protocol: v1.ProtocolTCP}
	if p.Name != nil {
		spn.Port = *p.Name
	}
	if p.Protocol != nil {
		spn.Protocol = *p.Protocol
	}
	return spn
}

func (t *endpointsTracker) observeSince(at time.Time, family string) {
	if d := t.clk.Since(at); d >= 0 {
		t.metrics.NetworkProgrammingLatency.WithLabelValues(family).Observe(d.Seconds())
	}
}

// sliceFamily is the ip_family label of a slice's addresses: kube-proxy's
// proxier of that family is the one that records its programming latency.
func sliceFamily(es *discovery.EndpointSlice) string {
	if es.AddressType == discovery.AddressTypeIPv6 {
		return ipv6Family
	}
	return ipv4Family
}

// isOpen reports whether spn's rules are written in family (an ip_family
// label). Called with mu held.
func (t *endpointsTracker) isOpen(spn loadbalancer.ServicePortName, family string) bool {
	return t.open[spn]&familiesOf([]string{family}) != 0
}

// setOpen is told, after a sync that wrote the rules of the families fams,
// of the service ports opened (true) or closed (false) since the last sync
// that wrote them all, and observes the trigger times that waited for them
// in those families: as kube-proxy's per-family proxiers each record their
// own, an IPv6 rule write that keeps failing holds back only IPv6's.
func (t *endpointsTracker) setOpen(changed map[loadbalancer.ServicePortName]bool, fams ipFamilies) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for spn, open := range changed {
		if open {
			t.open[spn] |= fams
		} else {
			// Closed: served in no family, whichever rules are left.
			delete(t.open, spn)
		}
	}
	for svc, triggers := range t.pending {
		kept := triggers[:0]
		for _, tr := range triggers {
			if slices.ContainsFunc(tr.ports, func(spn loadbalancer.ServicePortName) bool { return !t.isOpen(spn, tr.family) }) {
				kept = append(kept, tr)
				continue
			}
			t.observeSince(tr.at, tr.family)
		}
		if len(kept) == 0 {
			delete(t.pending, svc)
		} else {
			t.pending[svc] = kept
		}
	}
}

// moved is told that spn's proxy socket moved to another port (the rules
// written for it name the old one), or that spn is served in a family it
// was not (no rule of that family names it yet): it is open in no family
// until a sync writes them again (setOpen).
func (t *endpointsTracker) moved(spn loadbalancer.ServicePortName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.open, spn)
}

const endpointsTriggerTimeAnnotation = "endpoints.kubernetes.io/last-change-trigger-time"

// setPolicy records a Service's traffic policy and re-applies its endpoints
// when the policy changed. Called by sync with the current Services. A
// Service without a recorded policy is applied with the zero policy, so
// recording the zero policy (the default: Cluster, no hints preference)
// changes nothing: at 10,000 Services the first sync re-applied every
// Service's endpoints for it.
func (t *endpointsTracker) setPolicy(svc types.NamespacedName, p trafficPolicy, present bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.policies[svc]
	if present && p != (trafficPolicy{}) {
		t.policies[svc] = p
	} else {
		delete(t.policies, svc)
	}
	if old != p {
		t.apply(svc)
	}
}

// setFamilies records the IP families a Service is served in on this node
// (Proxier.servedFamilies; none: the Service is gone, or has no address
// to say) and re-applies its
// endpoints when that changes which of its slices count. As kube-proxy,
// whose proxier of a family takes the EndpointSlices of that address type
// and the Services with a ClusterIP of that family only, a single-stack
// Service takes no endpoint of another family's slice: an IPv4 Service
// whose only slice is IPv6 (a selectorless Service's hand-made slice, or
// the moment after a dual-stack Service went IPv4-only, before the
// EndpointSlice controller deletes the slice) has no endpoints, and its
// healthCheckNodePort no local pod. The other family's endpoints served
// its clients across families. Called by sync with the current Services.
func (t *endpointsTracker) setFamilies(svc types.NamespacedName, f ipFamilies) {
	if f == familyIPv4|familyIPv6 {
		f = 0 // dual-stack: every slice counts, as for a Service not known
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.families[svc]
	if old == f {
		return
	}
	if f == 0 {
		delete(t.families, svc)
	} else {
		t.families[svc] = f
	}
	for _, es := range t.slices[svc] {
		if old.takes(es.AddressType) != f.takes(es.AddressType) {
			t.apply(svc)
			return
		}
	}
}

// setNode changes the node's zone (learned from its Node object) and
// re-applies every Service, since topology filtering depends on it.
func (t *endpointsTracker) setNode(node nodeTopology) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.node == node {
		return
	}
	t.node = node
	for svc := range t.slices {
		t.apply(svc)
	}
}

// localEndpoints is svc's count of ready local pods that its
// healthCheckNodePort reports to a check that arrived on the node address
// at: that family's, as kube-proxy's proxier of the family answers (each
// on its family's --nodeport-addresses), for a dual-stack Service; a
// single-stack Service's own family's wherever the check arrived (its
// other family counts none: setFamilies), as its one proxier answers
// there; the larger family's when at is not known.
func (t *endpointsTracker) localEndpoints(svc types.NamespacedName, at netip.Addr) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.local[svc]
	if !at.IsValid() || t.families[svc] != 0 {
		return max(n[0], n[1])
	}
	if at.Unmap().Is4() {
		return n[0]
	}
	return n[1]
}

// apply merges every slice of svc into endpoint lists per service port,
// filters them by the Service's traffic policy and hands them to the
// balancer. Returns whether any balancer entry changed.
func (t *endpointsTracker) apply(svc types.NamespacedName) bool {
	byPort := endpointsByPort(svc, t.slicesOfFamilies(svc))
	policy := t.policies[svc]
	want := map[loadbalancer.ServicePortName][]loadbalancer.Endpoint{}
	localIPs := map[netip.Addr]bool{}
	var noLocal noLocalPorts
	for spn, eps := range byPort {
		eps = dedupe(eps)
		want[spn] = policy.internalEndpoints(eps, t.node)
		if policy.splitExternal() {
			want[externalName(spn)] = policy.splitEndpoints(eps, t.node)
		}
		addReadyLocalIPs(localIPs, eps, t.node.name)
		noLocal = noLocal.add(policy, eps, t.node.name)
	}
	if local := localPodCount(localIPs); local != ([2]int{}) {
		t.local[svc] = local
	} else {
		delete(t.local, svc)
	}
	t.setNoLocal(svc, noLocal)
	changed := false
	for spn := range t.applied[svc] {
		if _, ok := want[spn]; !ok {
			changed = t.lb.SetEndpoints(spn, nil) || changed
		}
	}
	names := make(map[loadbalancer.ServicePortName]bool, len(want))
	for spn, eps := range want {
		names[spn] = true
		changed = t.lb.SetEndpoints(spn, eps) || changed
	}
	if len(names) == 0 {
		delete(t.applied, svc)
	} else {
		t.applied[svc] = names
	}
	if changed && t.changed != nil {
		t.changed(svc)
	}
	return changed
}

// slicesOfFamilies are svc's slices of the address types its families
// take (setFamilies); all of them for a Service not known or dual-stack.
func (t *endpointsTracker) slicesOfFamilies(svc types.NamespacedName) map[string]*discovery.EndpointSlice {
	all := t.slices[svc]
	f := t.families[svc]
	if f == 0 {
		return all
	}
	var kept map[string]*discovery.EndpointSlice
	for name, es := range all {
		if !f.takes(es.AddressType) {
			if kept == nil {
				kept = maps.Clone(all)
			}
			delete(kept, name)
		}
	}
	if kept == nil {
		return all
	}
	return kept
}

// noLocalPorts counts service ports with a Local policy and endpoints, none
// of them on this node: internal (ClusterIP traffic) and external, per IP
// family of the endpoints ([0] IPv4, [1] IPv6), as each of kube-proxy's
// per-family proxiers counts the endpoints of its family.
type noLocalPorts [2]struct{ internal, external int }

// add counts one service port with endpoints eps under policy, for each
// family of its endpoints, as kube-proxy does: only a family with a
// servable endpoint somewhere, none of them on this node.
func (n noLocalPorts) add(policy trafficPolicy, eps []loadbalancer.Endpoint, node string) noLocalPorts {
	if !policy.internalLocal && !policy.externalLocal {
		return n
	}
	for fam := range n { // loadbalancer.Family's index
		servable := func(e loadbalancer.Endpoint) bool { return loadbalancer.Family(e.Addr) == fam && e.Servable() }
		if !slices.ContainsFunc(eps, servable) {
			continue
		}
		if node != "" && slices.ContainsFunc(eps, func(e loadbalancer.Endpoint) bool { return e.NodeName == node && servable(e) }) {
			continue
		}
		if policy.internalLocal {
			n[fam].internal++
		}
		if policy.externalLocal {
			n[fam].external++
		}
	}
	return n
}

// setNoLocal records svc's count and publishes the totals.
func (t *endpointsTracker) setNoLocal(svc types.NamespacedName, n noLocalPorts) {
	old := t.noLocal[svc]
	if n == old {
		return
	}
	if n == (noLocalPorts{}) {
		delete(t.noLocal, svc)
	} else {
		t.noLocal[svc] = n
	}
	for i, family := range [2]string{ipv4Family, ipv6Family} {
		t.noLocalTotal[i].internal += n[i].internal - old[i].internal
		t.noLocalTotal[i].external += n[i].external - old[i].external
		if n[i] == old[i] {
			continue
		}
		t.metrics.NoLocalEndpoints.WithLabelValues("internal", family).Set(float64(t.noLocalTotal[i].internal))
		t.metrics.NoLocalEndpoints.WithLabelValues("external", family).Set(float64(t.noLocalTotal[i].external))
	}
}

// endpointsByPort lists, per service port, every address of every slice of
// svc with that port's number. A port outside 1-65535 or an address that is
// not a plain IP (the API server refuses both, a hand-made object may not)
// is left out: a uint16 conversion would turn port 70000 into 4464.
func endpointsByPort(svc types.NamespacedName, sliceMap map[string]*discovery.EndpointSlice) map[loadbalancer.ServicePortName][]loadbalancer.Endpoint {
	byPort := map[loadbalancer.ServicePortName][]loadbalancer.Endpoint{}
	// In name order: the same slices must give the same list every time
	// (map order made explain's output and the duplicates kept vary).
	for _, name := range slices.Sorted(maps.Keys(sliceMap)) {
		es := sliceMap[name]
		for _, p := range es.Ports {
			if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
				continue
			}
			spn := slicePortName(svc, p)
			for _, ep := range es.Endpoints {
				// An endpoint's addresses are fungible (the API lets
				// consumers use only the first, as kube-proxy does): one
				// pod is one round-robin slot and one affinity target.
				if len(ep.Addresses) == 0 {
					continue
				}
				// Leading zeros an older API server stored are
				// read as decimal, as kube-proxy reads them.
				a, ok := config.ParseObjectIP(ep.Addresses[0])
				if !ok {
					continue
				}
				e := endpointFromSlice(ep)
				e.Addr = netip.AddrPortFrom(a, uint16(*p.Port))
				byPort[spn] = append(byPort[spn], e)
			}
		}
	}
	return byPort
}

func endpointFromSlice(ep discovery.Endpoint) loadbalancer.Endpoint {
	// Nil conditions mean "unknown"; the API says to treat ready and
	// serving as true (kube-proxy's endpointslicecache does), so a
	// terminating endpoint without serving is a fallback candidate.
	ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
	serving := ep.Conditions.Serving == nil || *ep.Conditions.Serving
	terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
	e := loadbalancer.Endpoint{Ready: ready, Serving: serving, Terminating: terminating}
	if ep.NodeName != nil {
		e.NodeName = *ep.NodeName
	}
	if ep.Zone != nil {
		e.Zone = *ep.Zone
	}
	if ep.Hints != nil {
		for _, z := range ep.Hints.ForZones {
			e.ZoneHints = append(e.ZoneHints, z.Name)
		}
		for _, n := range ep.Hints.ForNodes {
			e.NodeHints = append(e.NodeHints, n.Name)
		}
	}
	return e
}

// dedupe drops the same address listed twice, keeping one copy by a rank
// that does not depend on which came first: a copy not terminating beats
// one terminating, as kube-proxy keeps it (a pod network may give a
// terminating pod's IP to a new pod, which is the one there now, ready or
// not), then ready beats serving (an endpoint seen in two slices while it
// moves between them).
func dedupe(eps []loadbalancer.Endpoint) []loadbalancer.Endpoint {
	at := make(map[netip.AddrPort]int, len(eps))
	out := eps[:0]
	for _, e := range eps {
		i, ok := at[e.Addr]
		if !ok {
			at[e.Addr] = len(out)
			out = append(out, e)
			continue
		}
		if servesBetter(e, out[i]) {
			out[i] = e
		}
	}
	return out
}

func servesBetter(a, b loadbalancer.Endpoint) bool {
	rank := func(e loadbalancer.Endpoint) int {
		r := 0
		if !e.Terminating {
			r = 4
		}
		switch {
		case e.Ready:
			r += 2
		case e.Serving:
			r++
		}
		return r
	}
	return rank(a) > rank(b)
}
