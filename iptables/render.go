package iptables

import (
	"bytes"
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// chainRules is the desired or observed contents of our chains: for each
// chain, its rules in order, as printed after "-A CHAIN " by iptables-save.
type chainRules map[string][]string

// Render returns the exact iptables-restore input that makes our chains
// hold the rules for portals: every chain is declared (which flushes it
// under --noflush) and refilled. Portals of the other IP family and portals
// with a missing port are left out.
func (r *Rules) Render(portals []Portal) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	want := r.desired(portals)
	return restoreInput(want, renderedChains(want), nil, nil)
}

// restoreInput prints the given chains of want as iptables-restore input,
// one *table section per table that has a chain in either list; the drop
// chains (buckets no longer wanted) are flushed and deleted after the
// others are written, so nothing jumps to them any more. jumps are
// further lines (-A or -I in a built-in chain), after the chains they name.
func restoreInput(want chainRules, chains, drop []ownedChain, jumps []string) []byte {
	var b bytes.Buffer
	size := 0
	for _, c := range chains {
		for _, rule := range want[c.name] {
			size += len(c.name) + len(rule) + 5
		}
	}
	b.Grow(size + 512)
	for _, table := range []Table{TableNAT, TableFilter} {
		these, gone := namesIn(chains, table), namesIn(drop, table)
		if len(these) == 0 && len(gone) == 0 {
			continue
		}
		b.WriteString("*" + string(table) + "\n")
		for _, name := range append(slices.Clone(these), gone...) {
			b.WriteString(":" + name + " - [0:0]\n")
		}
		for _, name := range these {
			for _, rule := range want[name] {
				b.WriteString("-A ")
				b.WriteString(name)
				b.WriteByte(' ')
				b.WriteString(rule)
				b.WriteByte('\n')
			}
		}
		for _, line := range jumps {
			b.WriteString(line + "\n")
		}
		for _, name := range gone {
			b.WriteString("-X " + name + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.Bytes()
}

func namesIn(chains []ownedChain, table Table) []string {
	var out []string
	for _, c := range chains {
		if c.table == table {
			out = append(out, c.name)
		}
	}
	return out
}

// desired renders portals into the contents of every chain we own. Rules
// are built as text, in the argument order and quoting iptables-save uses,
// so the read-back compares equal without parsing. Each portal is rendered
// once and reused while it stays (see renderAll); this pass only joins the
// portals' rules in order, dropping repeats (a rule that names a Service
// can only repeat within that Service port's portals, which sort next to
// each other), and renders the guard chain from every portal's proxy ports.
func (r *Rules) desired(portals []Portal) chainRules {
	usable := r.usable(portals)
	rendered := r.renderAll(usable)
	out := make([][]string, len(ownedChains))
	for c := range out {
		n := 0
		for _, pr := range rendered {
			n += len(pr.chains[c])
		}
		out[c] = make([]string, 0, n)
	}
	var guards []guardKey
	groupStart := make([]int, len(ownedChains)) // per chain, where this Service port's rules begin
	bucket := make([][]uint8, len(ownedChains)) // per chain and rule, its bucket (chains.go)
	var b uint8
	for i, pr := range rendered {
		if i == 0 || usable[i].Name != usable[i-1].Name {
			for c := range groupStart {
				groupStart[c] = len(out[c])
			}
			b = bucketOf(usable[i].Name)
		}
		guards = append(guards, pr.guards...)
		for c, rules := range pr.chains {
			for _, rule := range rules {
				if slices.Contains(out[c][groupStart[c]:], rule) {
					continue
				}
				out[c] = append(out[c], rule)
				bucket[c] = append(bucket[c], b)
			}
		}
	}
	out[guardChain], bucket[guardChain] = guardRules(guards)
	out[portalsAcceptChain], bucket[portalsAcceptChain] = portalsAcceptRules(out[guardChain]), bucket[guardChain]
	out[rejectChain], bucket[rejectChain] = r.portalsRejectRules(out[guardChain]), bucket[guardChain]
	want := make(chainRules, len(ownedChains))
	for c, oc := range ownedChains {
		if len(out[c]) > r.bucketAbove {
			r.splitIntoBuckets(want, oc.name, out[c], bucket[c])
			continue
		}
		if len(out[c]) == 0 {
			out[c] = nil
		}
		want[oc.name] = out[c]
	}
	return want
}

// splitIntoBuckets puts rules into the buckets of chain, in order, and a
// jump to each bucket into chain itself (see numBuckets).
func (r *Rules) splitIntoBuckets(want chainRules, chain string, rules []string, bucket []uint8) {
	jumps := make([]string, numBuckets)
	var sizes [numBuckets]int
	for _, b := range bucket {
		sizes[b]++
	}
	// One backing array, cut per bucket: no growth, one allocation.
	all := make([]string, 0, len(rules))
	parts := make([][]string, numBuckets)
	for b, n := range sizes {
		if n > 0 {
			parts[b] = all[len(all) : len(all) : len(all)+n]
			all = all[:len(all)+n]
		}
	}
	for i, rule := range rules {
		parts[bucket[i]] = append(parts[bucket[i]], rule)
	}
	for b := range numBuckets {
		name := bucketChain(chain, b)
		jumps[b] = "-j " + name
		want[name] = parts[b]
	}
	want[chain] = jumps
}

// portalRules is one portal's rendering: its rules per owned chain (indexed
// as ownedChains; the guard chain's stay empty), without repeats within the
// portal, and the proxy ports its guard rules must cover.
type portalRules struct {
	chains [][]string
	guards []guardKey
}

// guardKey is a proxy port the guard covers (guard.go groups them into rules).
type guardKey struct {
	proto Protocol
	port  int
}

// guardChain, portalsAcceptChain and rejectChain are the indexes in
// ownedChains of the chains rendered from every portal's proxy ports
// together.
var (
	guardChain         = chainIndex(ChainProxyPortGuard)
	portalsAcceptChain = chainIndex(ChainPortalsNonLocal)
	rejectChain        = chainIndex(ChainProxyPortReject)
)

func chainIndex(name string) int {
	for i, c := range ownedChains {
		if c.name == name {
			return i
		}
	}
	panic("not our chain: " + name)
}

// renderCache keeps the rendering of the last portal set, sorted as usable
// sorts it, so the next call renders only portals it has not seen.
type renderCache struct {
	portals []Portal
	rules   []*portalRules
}

// renderAll returns the rendering of each of usable (sorted), reusing the
// cached rendering of every portal seen on the previous call: one merge
// walk of two sorted lists, no hashing. The cache then holds this set.
func (r *Rules) renderAll(usable []Portal) []*portalRules {
	out := make([]*portalRules, len(usable))
	old := r.cache
	var podSrcs []string
	var nodePortDsts []nodePortDst
	i := 0
	for j, p := range usable {
		for i < len(old.portals) && comparePortals(old.portals[i], p) < 0 {
			i++
		}
		if i < len(old.portals) && comparePortals(old.portals[i], p) == 0 {
			out[j] = old.rules[i]
			i++
			continue
		}
		if nodePortDsts == nil {
			nodePortDsts = r.nodePortDestinations()
			for _, c := range r.cfg.clusterCIDRs() {
				podSrcs = append(podSrcs, "-s "+c.String()+" ")
			}
		}
		out[j] = r.renderPortal(p, podSrcs, nodePortDsts)
	}
	r.cache = renderCache{portals: usable, rules: out}
	return out
}

// renderPortal renders one portal's rules.
func (r *Rules) renderPortal(p Portal, podSrcs []string, nodePortDsts []nodePortDst) *portalRules {
	pr := &portalRules{chains: make([][]string, len(ownedChains))}
	if p.GuardOnly {
		pr.guards = []guardKey{{p.Protocol, p.ProxyPort}}
		return pr
	}
	if p.HealthCheck {
		// Only where the health server listens: every local address, or
		// the node's addresses in --nodeport-addresses (a range the server
		// does not listen in must not open the port to another listener).
		c := chainIndex(ChainNodePortNonLocal)
		for _, d := range nodePortDsts {
			dst := d.match
			if dst == notIPv6Loopback {
				dst = "" // the server listens on ::1 too (NodePorts alone leave it out)
			}
			pr.chains[c] = append(pr.chains[c], dst+"-p tcp -m comment --comment "+quoteSaveString(p.Name+healthCheckComment)+
				" -m tcp --dport "+strconv.Itoa(p.Port)+nonLocalConntrack)
		}
		return pr
	}
	add := func(chain, rule string) {
		c := chainIndex(chain)
		if !slices.Contains(pr.chains[c], rule) {
			pr.chains[c] = append(pr.chains[c], rule)
		}
	}
	proto := string(p.Protocol)
	protoComment := "-p " + proto + " -m comment --comment " + quoteSaveString(p.Name)
	dport := " -m " + proto + " --dport " + strconv.Itoa(p.Port) + " "
	proxyPorts := []int{p.ProxyPort}
	// portal writes one service address's rules: the shortcut of an
	// externalTrafficPolicy: Local portal first (pods' traffic in
	// PREROUTING; in OUTPUT every packet is the node's own, the
	// kernel's --src-type LOCAL, so there it simply replaces the
	// Local target), then the rule every other client meets.
	// A hostOnly destination (nodePortDst) gets no PREROUTING rule.
	portal := func(container, host, dst string, hostOnly bool) {
		toHost := r.hostTarget(p.ProxyPort)
		if p.ClusterProxyPort != 0 {
			toHost = r.hostTarget(p.ClusterProxyPort)
		}
		add(host, dst+protoComment+dport+toHost)
		if hostOnly {
			return
		}
		if p.ClusterProxyPort != 0 {
			for _, src := range podSrcs {
				add(container, src+dst+protoComment+dport+r.containerTarget(p.ClusterProxyPort))
			}
		}
		add(container, dst+protoComment+dport+r.containerTarget(p.ProxyPort))
	}
	if p.ClusterProxyPort != 0 {
		proxyPorts = append(proxyPorts, p.ClusterProxyPort)
	}
	if p.NodePort {
		for _, d := range nodePortDsts {
			if d.match == ipv6LoopbackDst {
				// --nodeport-addresses localhost (or ::1/128): kube-proxy
				// skips a loopback node IP in IPv6 ("localhost NodePorts
				// are not supported on IPv6"), so [::1]:NodePort is not
				// the Service's there; the healthCheckNodePort server
				// still listens on ::1 (above).
				continue
			}
			portal(ChainNodePortContainer, ChainNodePortHost, d.match, d.hostOnly)
		}
		for _, port := range proxyPorts {
			// NEW connections only, as the legacy proxier's rule (-m state
			// --state NEW) and the design: an INVALID packet to a NodePort
			// proxy port was accepted too.
			add(ChainNodePortNonLocal, protoComment+" -m "+proto+" --dport "+strconv.Itoa(port)+nonLocalConntrack)
		}
	} else {
		portal(ChainPortalsContainer, ChainPortalsHost, "-d "+netip.PrefixFrom(p.IP.Unmap(), r.cfg.Family.hostBits()).String()+" ", false)
		for _, rule := range r.sourceRangeRules(p, protoComment) {
			add(ChainLBSourceRanges, rule)
		}
	}
	// The guard's rules (what they match: guardConntrack) are rendered for
	// all portals together (guardRules).
	for _, port := range proxyPorts {
		if key := (guardKey{p.Protocol, port}); !slices.Contains(pr.guards, key) {
			pr.guards = append(pr.guards, key)
		}
	}
	return pr
}

// sourceRangeRules renders a LoadBalancer-IP portal's loadBalancerSourceRanges
// as filter rules. They sit in INPUT, where every portal's traffic arrives
// (DNAT or REDIRECT to a local proxy socket), and match the service address
// conntrack remembers, so the portal rules stay as they are and one socket
// keeps serving the ClusterIP and NodePort without ranges: an allowed
// source returns, any other is dropped, as kube-proxy's firewall chain
// does. A range holding the node IP also allows the LB IP as source, for
// load balancers whose traffic loops back with it (kube-proxy's
// allowFromNode).
func (r *Rules) sourceRangeRules(p Portal, protoComment string) []string {
	ranges := r.cfg.familyCIDRs(p.SourceRanges)
	if len(ranges) == 0 || slices.ContainsFunc(ranges, func(c netip.Prefix) bool { return c.Bits() == 0 }) {
		return nil
	}
	lb := p.IP.Unmap()
	orig := " -m conntrack --ctorigdst " + lb.String() + " --ctorigdstport " + strconv.Itoa(p.Port) + " -j "
	out := make([]string, 0, len(ranges)+2)
	fromNode := false
	for _, c := range ranges {
		out = append(out, "-s "+c.String()+" "+protoComment+orig+"RETURN")
		fromNode = fromNode || c.Contains(r.cfg.NodeIP.Unmap())
	}
	if fromNode {
		out = append(out, "-s "+netip.PrefixFrom(lb, r.cfg.Family.hostBits()).String()+" "+protoComment+orig+"RETURN")
	}
	return append(out, protoComment+orig+"DROP")
}

// usable returns the portals this family renders, sorted so that the
// rendering is stable whatever order the caller keeps them in.
func (r *Rules) usable(portals []Portal) []Portal {
	var out []Portal
	for _, p := range portals {
		if p.GuardOnly {
			if p.Protocol != "" && validPort(p.ProxyPort) {
				out = append(out, Portal{Name: p.Name, Protocol: p.Protocol, ProxyPort: p.ProxyPort, GuardOnly: true})
			}
			continue
		}
		if p.HealthCheck {
			if validPort(p.Port) {
				out = append(out, Portal{Name: p.Name, Protocol: TCP, Port: p.Port, HealthCheck: true})
			}
			continue
		}
		if p.Protocol == "" || !validPort(p.Port) || !validPort(p.ProxyPort) {
			continue
		}
		if !validPort(p.ClusterProxyPort) {
			p.ClusterProxyPort = 0
		}
		if !p.NodePort && !r.cfg.Family.owns(p.IP) {
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, comparePortals)
	return out
}

// comparePortals orders portals by every field, so a set of portals sorts
// the same whatever order it came in. It returns at the first field that
// differs: with 10,000 portals the sort makes ~130,000 comparisons.
func comparePortals(a, b Portal) int {
	if c := strings.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Protocol, b.Protocol); c != 0 {
		return c
	}
	if c := boolCompare(a.NodePort, b.NodePort); c != 0 {
		return c
	}
	if c := boolCompare(a.GuardOnly, b.GuardOnly); c != 0 {
		return c
	}
	if c := boolCompare(a.HealthCheck, b.HealthCheck); c != 0 {
		return c
	}
	if c := a.IP.Unmap().Compare(b.IP.Unmap()); c != 0 {
		return c
	}
	return cmp.Or(
		cmp.Compare(a.Port, b.Port),
		cmp.Compare(a.ProxyPort, b.ProxyPort),
		cmp.Compare(a.ClusterProxyPort, b.ClusterProxyPort),
		slices.CompareFunc(a.SourceRanges, b.SourceRanges, comparePrefixes),
	)
}

func comparePrefixes(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

func validPort(p int) bool { return p > 0 && p <= 65535 }

func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// nodePortDst is one destination NodePort rules are written for.
type nodePortDst struct {
	match string // starts the rules: "-d CIDR ", or "" / notIPv6Loopback
	// hostOnly: the CIDR holds loopback addresses only (--nodeport-addresses
	// localhost), which only the node's own connections (OUTPUT) reach. A
	// packet from another host or a pod with such a destination is a martian
	// the node drops (route_localnet is never set), unless a PREROUTING rule
	// DNATs it to the node IP first, before routing looks: with one, every
	// neighbour (and a pod with CAP_NET_RAW) reached these NodePorts by
	// sending to 127.0.0.1.
	hostOnly bool
}

// nodePortDestinations returns the destinations that start NodePort rules:
// "-d CIDR " per --nodeport-addresses entry, or a single empty match
// (the addrtype LOCAL on the jump alone) when all local addresses are wanted;
// in IPv6 that match leaves ::1 out, as kube-proxy's jump to KUBE-NODEPORTS
// does (localhost NodePorts are IPv4 only there): the node's own
// connections to [::1]:NodePort were the Service's.
func (r *Rules) nodePortDestinations() []nodePortDst {
	cidrs := r.cfg.nodePortCIDRs()
	if len(cidrs) == 0 {
		if r.cfg.Family == IPv6 {
			return []nodePortDst{{match: notIPv6Loopback}}
		}
		return []nodePortDst{{match: ""}}
	}
	out := make([]nodePortDst, len(cidrs))
	for i, c := range cidrs {
		out[i] = nodePortDst{match: "-d " + c.String() + " ", hostOnly: c.Addr().IsLoopback() && c.Bits() >= loopbackBits(c.Addr())}
	}
	return out
}

// loopbackBits is the length of the family's loopback prefix (127.0.0.0/8,
// ::1/128): a CIDR at least this long around a loopback address holds
// nothing else.
func loopbackBits(a netip.Addr) int {
	if a.Is4() {
		return 8
	}
	return 128
}

// NodePortCaptures reports whether the NodePort rules take a connection
// to ip, one of the node's own addresses (Config.NodePortCaptures).
func (r *Rules) NodePortCaptures(ip netip.Addr) bool { return r.cfg.NodePortCaptures(ip) }

// notIPv6Loopback is the IPv6 NodePort rules' destination match when every
// local address takes NodePorts (nodePortDestinations).
const notIPv6Loopback = "! -d ::1/128 "

// ipv6LoopbackDst is the destination match of an IPv6 --nodeport-addresses
// CIDR ::1/128 (the localhost keyword's), which takes no NodePort.
const ipv6LoopbackDst = "-d ::1/128 "

// containerTarget is where traffic from other hosts and pods (PREROUTING)
// goes: DNAT to the bind address, or when sockets listen on every address
// DNAT to the node IP. REDIRECT only on request (the legacy rule), without
// a node IP, or with an IPv6 link-local one: it needs an address on the
// incoming interface, which pod veths of several CNIs do not have
// (Config.PreroutingRedirect); a link-local node IP is local on its own
// link only, so a packet of any other link DNATed to it was routed out
// again and lost (every IPv6 interface has a link-local address, which
// REDIRECT can take).
func (r *Rules) containerTarget(proxyPort int) string {
	if !r.cfg.bindsAll() {
		return dnatTo(r.cfg.BindAddress, proxyPort)
	}
	if !r.cfg.PreroutingRedirect && r.cfg.Family.owns(r.cfg.NodeIP) && !LinkScoped(r.cfg.NodeIP) {
		return dnatTo(r.cfg.NodeIP, proxyPort)
	}
	return redirectTo(proxyPort)
}

// LinkScoped reports an IPv6 link-local address: local only on the link
// that holds it, so not a DNAT target for traffic of other links.
func LinkScoped(addr netip.Addr) bool {
	return addr.Is6() && !addr.Is4In6() && addr.IsLinkLocalUnicast()
}

// hostTarget is where traffic the node sends itself (OUTPUT) goes: DNAT to
// the node IP (not loopback: no route_localnet needed) or the bind address.
// Without a node IP, or with an IPv6 link-local one, REDIRECT (to the
// loopback address): a packet DNATed in OUTPUT to a link-local address is
// rerouted on the device of its first route only, so the node's own
// connection to its NodePort on another address (or [::1]), or to a
// Service address routed out of another interface, was sent out of that
// link and lost.
func (r *Rules) hostTarget(proxyPort int) string {
	if !r.cfg.bindsAll() {
		return dnatTo(r.cfg.BindAddress, proxyPort)
	}
	if r.cfg.Family.owns(r.cfg.NodeIP) && !LinkScoped(r.cfg.NodeIP) {
		return dnatTo(r.cfg.NodeIP, proxyPort)
	}
	return redirectTo(proxyPort)
}

func redirectTo(port int) string {
	return "-j REDIRECT --to-ports " + strconv.Itoa(port)
}

func dnatTo(addr netip.Addr, port int) string {
	return "-j DNAT --to-destination " + netip.AddrPortFrom(addr.Unmap(), uint16(port)).String()
}
