package proxier

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// Plan is a Proxier that opens no socket and programs nothing: fed by a
// source like any Proxier, its Run performs the real sync and reports what
// a proxier with the same options would serve and which portals it would
// hand to the iptables syncers (`kube-userspace-proxy explain`).
//
// Proxy ports are illustrative: a running proxier gets them from the
// kernel, or at random from --proxy-port-range. A plan numbers the
// service ports in name order from the range's first port (61001 when the
// kernel chooses), so the same input explains the same way every time; for
// the same reason endpoints keep their given order instead of the
// shuffled one a running proxier starts from.
type Plan struct {
	p      *Proxier
	v4, v6 portalRecorder

	// portRange is --proxy-port-range: the plan numbers ports from it
	// itself, in name order, and runs out where a proxier would.
	portRange PortRange

	mu    sync.Mutex
	index map[loadbalancer.ServicePortName]int
	calls map[loadbalancer.ServicePortName]int
	// nodePorts are the Services' node ports, sorted: the numbering skips
	// them, as a proxier's allocator never hands them out.
	nodePorts []int
}

// PlanFirstPort is the first illustrative proxy port when the kernel
// chooses ports.
const PlanFirstPort = 61001

// NewPlan returns a plan for a proxier with opts. Portal syncers,
// NodePort claims, conntrack cleaning and healthCheckNodePort servers are
// the plan's own (recorders, or off): it touches nothing outside itself.
func NewPlan(opts Options) *Plan {
	pl := &Plan{index: map[loadbalancer.ServicePortName]int{}, calls: map[loadbalancer.ServicePortName]int{}, portRange: opts.PortRange}
	// The allocator picks at random: with a range it would hand a small
	// range's ports to whichever service ports came first in map order,
	// and the plan's numbers fall outside it. listen numbers them instead.
	opts.PortRange = PortRange{}
	opts.IPv4Portals, opts.IPv6Portals = &pl.v4, &pl.v6
	opts.ClaimNodePorts = false
	opts.Conntrack = nil
	opts.ServiceHealth = planHealth{}
	pl.p = New(opts)
	pl.p.lb.KeepOrder()
	pl.p.listen = pl.listen
	return pl
}

// OnlyFamily makes the plan a proxier with portal rules in one family only
// (six: IPv6), as one whose --bind-address names an address of that
// family: the other family's Services are served as on a node without
// that family's netfilter. Call it before Run.
func (pl *Plan) OnlyFamily(six bool) {
	if six {
		pl.p.opts.IPv4Portals = nil
	} else {
		pl.p.opts.IPv6Portals = nil
	}
}

// Handler is what the source feeds.
func (pl *Plan) Handler() config.Handler { return pl.p }

// SetNodeZone gives the plan its node's zone (the Node object's
// topology.kubernetes.io/zone label), whose topology hints decide the
// endpoints as on a proxier told it by its Node informer. Without it (no
// Node, manifests) hints are not used, as by a proxier that knows no zone.
func (pl *Plan) SetNodeZone(zone string) { pl.p.SetNodeZone(zone) }

// Run syncs once and returns the service ports as /debug/services would
// list them and the portals each family's syncer would be handed.
func (pl *Plan) Run() (ports []DebugServicePort, v4, v6 []iptables.Portal) {
	pl.p.mu.Lock()
	var names []loadbalancer.ServicePortName
	var nodePorts []int
	for _, svc := range pl.p.services {
		for _, info := range servicePorts(svc) {
			names = append(names, info.name)
			nodePorts = append(nodePorts, info.nodePort, info.healthCheckNodePort)
		}
	}
	pl.p.mu.Unlock()
	slices.Sort(nodePorts)
	slices.SortFunc(names, func(a, b loadbalancer.ServicePortName) int {
		if a.String() < b.String() {
			return -1
		}
		if a.String() > b.String() {
			return 1
		}
		return 0
	})
	pl.mu.Lock()
	for i, n := range names {
		pl.index[n] = i
	}
	pl.nodePorts = slices.Compact(nodePorts)
	pl.mu.Unlock()
	pl.p.Sync()
	return pl.p.DebugServices(), pl.v4.portals, pl.v6.portals
}

// Warnings lists, per Service ("namespace/name"), that it is not proxied
// (headless, ExternalName: as kube-proxy, for cluster DNS answers for
// them) and what a proxier fed the same Services warns about: annotations under our prefix it does not know
// (a misspelt fault annotation), SCTP ports it skips, and Services it
// does not serve for want of portals in their family (OnlyFamily); and a
// service port left without endpoints because its slices carry theirs
// under another port name or protocol (an unnamed slice port beside a
// named Service port: explain said "none ready" of ready endpoints), and a
// served Service that no EndpointSlice names at all (a Service written
// with a selector and no slice, a misspelt service-name label; "none
// ready" too), naming its namespace's slices of a Service not known. The
// proxier logs them at info level, which explain's output does not carry,
// so without this a typo'd annotation read as "faults: none" and an SCTP
// port, or an IPv6 Service beside an IPv4 --bind-address, simply went
// missing.
func (pl *Plan) Warnings() map[string][]string {
	pl.p.mu.Lock()
	defer pl.p.mu.Unlock()
	out := map[string][]string{}
	for nn, svc := range pl.p.services {
		var w []string
		// The Services servicePorts gives no port, as kube-proxy proxies
		// nothing for them: named, or a reader never saw them at all.
		switch {
		case svc.Spec.Type == v1.ServiceTypeExternalName:
			w = append(w, fmt.Sprintf("not proxied: type ExternalName is a name in cluster DNS only, an alias (CNAME) of %s; no address, rule or proxy socket is involved (as kube-proxy)",
				svc.Spec.ExternalName))
		case svc.Spec.ClusterIP == v1.ClusterIPNone:
			w = append(w, "not proxied: a headless Service (clusterIP None) has no service address; cluster DNS answers its name with its endpoints' addresses, which clients reach directly (as kube-proxy, which installs nothing for it)")
		}
		for _, info := range servicePorts(svc) {
			if carried, ok := pl.p.endpoints.portMismatch(info.name); ok {
				port := fmt.Sprintf("port %q (%s)", info.name.Port, info.name.Protocol)
				if info.name.Port == "" {
					port = fmt.Sprintf("the unnamed port (%s)", info.name.Protocol)
				}
				w = append(w, fmt.Sprintf("%s gets no endpoint: the Service's EndpointSlices have endpoints %s; an EndpointSlice port must have the Service port's name and protocol",
					port, carried))
			}
		}
		if other, own, ok := pl.p.endpoints.familyMismatch(nn); ok {
			w = append(w, fmt.Sprintf("no endpoint: the Service's EndpointSlices with endpoints are %s, and an %s-only Service takes only %s ones (as kube-proxy)",
				other, own, own))
		}
		if unknown := unknownAnnotations(nil, svc); len(unknown) > 0 {
			w = append(w, fmt.Sprintf("annotations this proxy does not know are ignored: %s (known: %s)",
				strings.Join(unknown, ", "), strings.Join(knownAnnotations, ", ")))
		}
		if sctp := config.SCTPPorts(svc); len(sctp) > 0 {
			w = append(w, fmt.Sprintf("SCTP ports are skipped (the userspace proxy carries TCP and UDP): %s", strings.Join(sctp, ", ")))
		}
		if pl.p.noPortal[nn] {
			// Only OnlyFamily takes a family's portals away in a plan.
			w = append(w, fmt.Sprintf("not served: its addresses are %s, which --bind-address %s does not serve",
				pl.p.unsupportedFamily(), pl.p.opts.BindAddress))
		}
		if orphans, elsewhere, fqdn, ok := pl.p.endpoints.sliceless(nn, pl.p.hasService); ok && !pl.p.noPortal[nn] && len(servicePorts(svc)) > 0 {
			msg := fmt.Sprintf("no EndpointSlice names this Service (label %s: %s in namespace %s): endpoints come only from EndpointSlices (or v1 Endpoints) labelled so, never from the selector (in a cluster the EndpointSlice controller writes them; with --manifests, write them)",
				discovery.LabelServiceName, nn.Name, nn.Namespace)
			if len(fqdn) > 0 {
				msg = fmt.Sprintf("only EndpointSlices of addressType FQDN name this Service (%s): they give no endpoint, as in kube-proxy, which takes endpoints only from IPv4 and IPv6 EndpointSlices (or v1 Endpoints) labelled %s: %s in namespace %s",
					strings.Join(fqdn, ", "), discovery.LabelServiceName, nn.Name, nn.Namespace)
			}
			if len(orphans) > 0 {
				msg += fmt.Sprintf("; EndpointSlices in namespace %s name no Service that exists: %s", nn.Namespace, strings.Join(orphans, ", "))
			}
			if len(elsewhere) > 0 {
				msg += fmt.Sprintf("; EndpointSlices labelled %s: %s in another namespace, which has no Service of that name: %s (a slice must be in its Service's namespace; one written without metadata.namespace is in default)",
					discovery.LabelServiceName, nn.Name, strings.Join(elsewhere, ", "))
			}
			w = append(w, msg)
		}
		if len(w) > 0 {
			out[nn.String()] = w
		}
	}
	return out
}

// Sliceless lists the Services ("namespace/name") that no IPv4 or IPv6
// EndpointSlice names, so that explain says why they have no endpoint
// rather than "none ready" (Warnings says what must name them), each with
// the FQDN slices that do name it (none: no slice at all).
func (pl *Plan) Sliceless() map[string][]string {
	pl.p.mu.Lock()
	defer pl.p.mu.Unlock()
	out := map[string][]string{}
	for nn := range pl.p.services {
		if _, _, fqdn, ok := pl.p.endpoints.sliceless(nn, pl.p.hasService); ok {
			out[nn.String()] = fqdn
		}
	}
	return out
}

// hasService reports whether the Service nn is known. The caller holds
// p.mu.
func (p *Proxier) hasService(nn types.NamespacedName) bool {
	_, ok := p.services[nn]
	return ok
}

// sliceless reports whether no IPv4 or IPv6 EndpointSlice names the
// Service svc (its kubernetes.io/service-name label, in its namespace),
// and lists the slices of that namespace whose label names a Service that
// does not exist ("webb-1 (kubernetes.io/service-name: webb)"): a
// misspelt label, the commonest reason; the slices of another namespace
// labelled with svc's name where no Service has it ("other/web-1"): a
// slice written without metadata.namespace, which puts it in default; at
// most maxOrphansNamed of each, then how many more; and the FQDN slices
// that name svc (ignored, as by kube-proxy), likewise bounded.
func (t *endpointsTracker) sliceless(svc types.NamespacedName, exists func(types.NamespacedName) bool) (orphans, elsewhere, fqdn []string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.slices[svc]) > 0 {
		return nil, nil, nil, false
	}
	fqdn = bounded(slices.Sorted(maps.Keys(t.fqdn[svc])))
	for other, bySlice := range t.slices {
		switch {
		case exists(other):
		case other.Namespace == svc.Namespace:
			for name := range bySlice {
				orphans = append(orphans, fmt.Sprintf("%s (%s: %s)", name, discovery.LabelServiceName, other.Name))
			}
		case other.Name == svc.Name:
			for name := range bySlice {
				elsewhere = append(elsewhere, other.Namespace+"/"+name)
			}
		}
	}
	slices.Sort(orphans)
	slices.Sort(elsewhere)
	return bounded(orphans), bounded(elsewhere), fqdn, true
}

// bounded keeps the first maxOrphansNamed of names, then says how many more.
func bounded(names []string) []string {
	if n := len(names); n > maxOrphansNamed {
		return append(names[:maxOrphansNamed], fmt.Sprintf("and %d more", n-maxOrphansNamed))
	}
	return names
}

// maxOrphansNamed bounds the slices a sliceless Service's warning names.
const maxOrphansNamed = 5

// LocalPolicy says which of a service port's traffic policies are Local:
// Internal (internalTrafficPolicy, ClusterIP traffic) and External
// (externalTrafficPolicy, NodePort, externalIP and LB IP traffic).
type LocalPolicy struct {
	Internal, External bool
	// HealthCheckNodePort is the Service's, served under External (0:
	// none, as for a NodePort Service).
	HealthCheckNodePort int
}

// LocalPolicies reports, per service port (as DebugServicePort.ServicePort
// names it), which of its traffic policies are Local. A row shows the
// endpoint lists these give, not why: an external socket comes with
// either policy Local alone, and holds this node's endpoints under one and
// every node's under the other.
func (pl *Plan) LocalPolicies() map[string]LocalPolicy {
	pl.p.mu.Lock()
	defer pl.p.mu.Unlock()
	out := map[string]LocalPolicy{}
	for _, svc := range pl.p.services {
		for _, info := range servicePorts(svc) {
			out[info.key] = LocalPolicy{Internal: info.policy.internalLocal, External: info.policy.externalLocal, HealthCheckNodePort: info.healthCheckNodePort}
		}
	}
	return out
}

// KernelChosenPorts reports whether a running proxier would let the
// kernel choose its proxy ports.
func (pl *Plan) KernelChosenPorts() bool { return pl.portRange.Size == 0 }

// listen stands in for newProxySocket: the first socket of a service port
// gets the index-th port from first that is not a node port, a second one
// (external traffic under a Local policy) the one a number of service
// ports further; past the end of --proxy-port-range the range is
// exhausted, as it would be for a proxier.
func (pl *Plan) listen(name loadbalancer.ServicePortName, _ netip.Addr, _ int, _ bool, _ *loadbalancer.ServicePort, _ *faults.Port, _ *socketConfig) (proxySocket, error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	first := PlanFirstPort
	if pl.portRange.Size > 0 {
		first = pl.portRange.Base
	}
	i := pl.index[name] + pl.calls[name]*len(pl.index)
	// Each node port from first up to the port moves it one further.
	port := first + i
	for n := pl.nodePortsIn(first, port); first+i+n != port; n = pl.nodePortsIn(first, port) {
		port = first + i + n
	}
	if r := pl.portRange; r.Size > 0 && port >= r.Base+r.Size {
		usable := r.Size - pl.nodePortsIn(r.Base, r.Base+r.Size-1)
		return nil, fmt.Errorf("%w: --proxy-port-range holds %d, fewer than the proxy sockets to open", ErrPortRangeExhausted, usable)
	}
	pl.calls[name]++
	return planSocket(port), nil
}

// nodePortsIn counts the node ports from lo to hi.
func (pl *Plan) nodePortsIn(lo, hi int) int {
	from, _ := slices.BinarySearch(pl.nodePorts, lo)
	to, _ := slices.BinarySearch(pl.nodePorts, hi+1)
	return to - from
}

// planSocket is a proxy socket that was never opened.
type planSocket int

func (s planSocket) Port() int    { return int(s) }
func (s planSocket) Start()       {}
func (s planSocket) Close() error { return nil }

// planHealth is the plan's healthCheckNodePort server: it opens nothing,
// and the plan's rules accept the ports a proxier's server would serve.
type planHealth struct{}

func (planHealth) SyncServices(map[types.NamespacedName]int) error { return nil }

// portalRecorder is a PortalSyncer that keeps the last set it was handed.
type portalRecorder struct{ portals []iptables.Portal }

func (r *portalRecorder) Sync(portals []iptables.Portal) error {
	r.portals = slices.Clone(portals)
	return nil
}

// familyMismatch reports whether the single-stack Service svc gets no
// endpoint because every EndpointSlice of it with endpoints is of the
// other address type (setFamilies), and names that family and the
// Service's own.
func (t *endpointsTracker) familyMismatch(svc types.NamespacedName) (other, own string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.families[svc]
	if f == 0 {
		return "", "", false
	}
	for _, es := range t.slices[svc] {
		if len(es.Endpoints) == 0 {
			continue
		}
		if f.takes(es.AddressType) {
			return "", "", false
		}
		ok = true
	}
	if !ok {
		return "", "", false
	}
	if f == familyIPv4 {
		return ipv6Family, ipv4Family, true
	}
	return ipv4Family, ipv6Family, true
}

// portMismatch reports whether spn gets no endpoint because its Service's
// EndpointSlices carry theirs under other ports (another name, another
// protocol, or none listed), and says which: "only for an unnamed TCP port
// (8080)", "but list no port". It is false when a slice with an endpoint
// has spn's port (its endpoints may still be unready or elsewhere: that
// is not a mismatch) or no slice has an endpoint.
func (t *endpointsTracker) portMismatch(spn loadbalancer.ServicePortName) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var carried []string
	found := false
	for _, es := range t.slicesOfFamilies(spn.NamespacedName) {
		if len(es.Endpoints) == 0 {
			continue
		}
		found = true
		for _, p := range es.Ports {
			got := slicePortName(spn.NamespacedName, p)
			if got == spn {
				return "", false
			}
			d := fmt.Sprintf("port %q %s", got.Port, got.Protocol)
			if got.Port == "" {
				d = fmt.Sprintf("an unnamed %s port", got.Protocol)
			}
			var notes []string
			if p.Port != nil {
				notes = append(notes, strconv.Itoa(int(*p.Port)))
			}
			if got.Port == spn.Port && got.Protocol == v1.ProtocolTCP {
				// The name matches: the protocol was left out, most
				// likely (the API server and the manifests default it).
				notes = append(notes, "a port without protocol is TCP")
			}
			if len(notes) > 0 {
				d += " (" + strings.Join(notes, "; ") + ")"
			}
			carried = append(carried, d)
		}
	}
	if !found {
		return "", false
	}
	if len(carried) == 0 {
		return "but list no port", true
	}
	slices.Sort(carried)
	return "only for " + strings.Join(slices.Compact(carried), ", "), true
}
