package proxier

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// PortalSyncer programs the portal rules of one IP family. Sync receives the
// complete desired set every time and must converge the kernel to it,
// repairing whatever someone else changed.
type PortalSyncer interface {
	Sync(portals []iptables.Portal) error
}

// PortalUpdater is a PortalSyncer with a cheap path for Service changes:
// Update also receives the complete set but may write only what changed
// since its last call and skip reading the kernel back. The proxier still
// calls Sync at least once per sync period, which repairs drift.
type PortalUpdater interface {
	PortalSyncer
	Update(portals []iptables.Portal) error
}

// PortalRepairer is a PortalSyncer that counts the Syncs that rewrote
// rules someone else had changed (iptables.Rules.Repairs).
type PortalRepairer interface {
	Repairs() uint64
}

// NodePortCapturer is a PortalSyncer that says which of the node's
// addresses its NodePort rules take (iptables.Rules.NodePortCaptures:
// --nodeport-addresses, and never IPv6's ::1), so that an endpoint on a
// NodePort's number is refused as one of the proxy's own portals only
// where the rules would send its dial back to the proxy. A syncer without
// it is taken to write the default rules (every local address but ::1).
type NodePortCapturer interface {
	NodePortCaptures(ip netip.Addr) bool
}

// PortalStopper is a PortalSyncer that can take back, when the proxy
// stops, its accepts of portal traffic while leaving the portals in place
// (iptables.Rules.Stop): traffic they send to a proxy port is then refused
// until a successor's first sync, not handed to whoever binds the port.
type PortalStopper interface {
	Stop() error
}

// portalProtocol is a service port's protocol as a portal's.
func portalProtocol(p v1.Protocol) iptables.Protocol {
	if p == v1.ProtocolUDP {
		return iptables.UDP
	}
	return iptables.TCP
}

// syncPortals hands every family its complete desired portal set: to
// Update (only what changed is written) unless full is set or the syncer
// has no such path. repaired: a family's Sync rewrote rules someone else
// had changed (PortalRepairer).
func (p *Proxier) syncPortals(full bool) (ok, repaired bool, failed []string) {
	if p.opts.IPv4Portals == nil && p.opts.IPv6Portals == nil {
		return true, false, nil
	}
	v4, v6 := make([]iptables.Portal, 0, len(p.active)), []iptables.Portal(nil)
	for _, ap := range p.portalOrder() {
		from4, from6 := len(v4), len(v6)
		v4, v6 = p.appendPortals(ap, v4, v6)
		v4, v6 = p.appendGuards(ap, v4, v6, from4, from6)
		v4, v6 = p.appendHealthCheck(ap, v4, v6)
	}
	ok = true
	for i, f := range []struct {
		s       PortalSyncer
		portals []iptables.Portal
		family  string
	}{{p.opts.IPv4Portals, v4, ipv4Family}, {p.opts.IPv6Portals, v6, ipv6Family}} {
		if f.s == nil {
			continue // no rules: none of its portals captures
		}
		sync := f.s.Sync
		if u, ok := f.s.(PortalUpdater); ok && !full {
			sync = u.Update
		}
		r, counts := f.s.(PortalRepairer)
		var before uint64
		if counts {
			before = r.Repairs()
		}
		err := sync(f.portals)
		p.sockCfg.ownPortals.written(i, f.portals, err != nil)
		if err != nil {
			ok = false
			failed = append(failed, f.family)
			p.metrics.IPTablesRestoreFailures.WithLabelValues(f.family).Inc()
			klog.ErrorS(err, "Failed to sync portal rules; will retry", "family", f.family)
		}
		if counts && r.Repairs() != before {
			repaired = true
		}
	}
	return ok, repaired, failed
}

// syncedFamilies are the families with a portal syncer that are not in
// failed: those a sync wrote the rules of.
func (p *Proxier) syncedFamilies(failed []string) []string {
	var out []string
	for _, f := range []struct {
		s      PortalSyncer
		family string
	}{{p.opts.IPv4Portals, ipv4Family}, {p.opts.IPv6Portals, ipv6Family}} {
		if f.s != nil && !slices.Contains(failed, f.family) {
			out = append(out, f.family)
		}
	}
	return out
}

// externalTargets are the sockets ap's external addresses (NodePort,
// externalIPs, LB IPs) send traffic to: outside's from other hosts,
// inside's from the node and pods (--cluster-cidr); 0, 0 while they have
// no portal.
func (ap *activePort) externalTargets() (outside, inside int) {
	policy := ap.info.policy
	switch {
	case ap.external == nil && policy.splitExternal() && !policy.bothLocal():
		// Its own socket failed to open (retried: retry.go): sending
		// external traffic to the cluster IP's socket would break the
		// policy, so it gets no portal meanwhile.
		return 0, 0
	case ap.external == nil:
		// One endpoint set for all (or, under both policies Local, the
		// shortcut's socket not open yet: the node and pods get the
		// node-local set meanwhile, as external clients do).
		return ap.proxyPort, ap.proxyPort
	case policy.bothLocal():
		// External clients share the cluster IP's node-local socket;
		// the node and its pods reach the cluster-wide one.
		return ap.proxyPort, ap.externalPort
	case policy.externalLocal:
		// Local external traffic, cluster-wide internal traffic: the
		// node and its pods reach external addresses through the
		// cluster IP's socket.
		return ap.externalPort, ap.proxyPort
	}
	return ap.externalPort, ap.externalPort
}

// appendPortals appends ap's portals to each family's.
func (p *Proxier) appendPortals(ap *activePort, v4, v6 []iptables.Portal) ([]iptables.Portal, []iptables.Portal) {
	proto := portalProtocol(ap.info.name.Protocol)
	hasV4, hasV6 := false, false
	add := func(ip netip.Addr, proxyPort, clusterPort int, sourceRanges ...netip.Prefix) {
		portal := iptables.Portal{Name: ap.info.key, Protocol: proto, IP: ip, Port: ap.info.port, ProxyPort: proxyPort,
			ClusterProxyPort: clusterPort, SourceRanges: sourceRanges}
		if ip.Is4() {
			hasV4 = true
			v4 = append(v4, portal)
		} else {
			hasV6 = true
			v6 = append(v6, portal)
		}
	}
	for _, ip := range ap.info.clusterIPs {
		add(ip, ap.proxyPort, 0)
	}
	// The node and pods meet clusterPort instead of externalPort when it
	// differs (kube-proxy's shortcut under externalTrafficPolicy Local).
	externalPort, clusterPort := ap.externalTargets()
	if externalPort == 0 {
		return v4, v6 // no portal while its second socket is missing
	}
	if clusterPort == externalPort {
		clusterPort = 0
	}
	for _, ip := range ap.info.externalIPs {
		add(ip, externalPort, clusterPort)
	}
	for _, ip := range ap.info.loadBalancerIPs {
		// An LB IP that is also an externalIP has its portal above and
		// no source ranges: kube-proxy captures externalIPs first,
		// straight to the Service, so its LB firewall never sees them.
		if !slices.Contains(ap.info.externalIPs, ip) {
			add(ip, externalPort, clusterPort, ap.info.sourceRanges...)
		}
	}
	if ap.info.nodePort != 0 {
		np := iptables.Portal{Name: ap.info.key, Protocol: proto, Port: ap.info.nodePort, NodePort: true, ProxyPort: externalPort, ClusterProxyPort: clusterPort}
		npV4, npV6 := ap.info.nodePortFamilies(hasV4, hasV6)
		if npV4 {
			v4 = append(v4, np)
		}
		if npV6 {
			v6 = append(v6, np)
		}
	}
	return v4, v6
}

// appendGuards guards each of ap's sockets in every family it listens in
// where no portal of it (appended from from4, from6) names it: a
// dual-stack socket of a one-family Service, or of any Service with
// --bind-address ::, and a socket of external traffic that has no
// external address yet, were reachable straight from other hosts there.
func (p *Proxier) appendGuards(ap *activePort, v4, v6 []iptables.Portal, from4, from6 int) ([]iptables.Portal, []iptables.Portal) {
	in4, in6 := p.listensIn(ap.info)
	proto := portalProtocol(ap.info.name.Protocol)
	named := func(portals []iptables.Portal, port int) bool {
		return slices.ContainsFunc(portals, func(pt iptables.Portal) bool { return pt.ProxyPort == port || pt.ClusterProxyPort == port })
	}
	guard := func(port int) {
		g := iptables.Portal{Name: ap.info.key, Protocol: proto, ProxyPort: port, GuardOnly: true}
		if in4 && !named(v4[from4:], port) {
			v4 = append(v4, g)
		}
		if in6 && !named(v6[from6:], port) {
			v6 = append(v6, g)
		}
	}
	guard(ap.proxyPort)
	if ap.external != nil {
		guard(ap.externalPort)
	}
	return v4, v6
}

// appendHealthCheck appends the accept of ap's healthCheckNodePort
// (externalTrafficPolicy Local on a LoadBalancer), which the health server
// serves, in the families of the port's NodePort, as kube-proxy's proxier of
// each family of the Service writes it; whether or not the node has a local
// endpoint, as there: a check must reach the server to hear 503. One per
// Service port, each with its name, as kube-proxy's.
func (p *Proxier) appendHealthCheck(ap *activePort, v4, v6 []iptables.Portal) ([]iptables.Portal, []iptables.Portal) {
	if ap.info.healthCheckNodePort == 0 || p.opts.ServiceHealth == nil {
		return v4, v6
	}
	hc := iptables.Portal{Name: ap.info.key, Protocol: iptables.TCP, Port: ap.info.healthCheckNodePort, HealthCheck: true}
	in4, in6 := ap.info.nodePortFamilies(ap.info.portalFamilies())
	if in4 {
		v4 = append(v4, hc)
	}
	if in6 {
		v6 = append(v6, hc)
	}
	return v4, v6
}

// portalOrder is the active service ports in the order of their portals'
// names (the debug rows' order, published just before), so the portals
// reach the iptables renderer nearly sorted and its sort has little to do
// (a sort of 10,000 portals in map order was a tenth of a Service change's
// sync). Map order, should the rows ever not match the active ports.
func (p *Proxier) portalOrder() []*activePort {
	ordered := make([]*activePort, 0, len(p.active))
	if len(p.debug) == len(p.active) {
		for _, r := range p.debug {
			ap := p.active[r.name]
			if ap == nil {
				break
			}
			ordered = append(ordered, ap)
		}
		if len(ordered) == len(p.active) {
			return ordered
		}
	}
	ordered = ordered[:0]
	for _, ap := range p.active {
		ordered = append(ordered, ap)
	}
	return ordered
}
