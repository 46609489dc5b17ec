package iptables

import (
	"net/netip"
	"strconv"
	"time"
)

// reuseReadFor is how old a dump ProxyPortsInKernel read may be for the
// Sync after it to use. The proxier's first sync opens its sockets in
// between (about 0.3 s at 10,000 Services); a change someone makes to our
// chains meanwhile is repaired by the next periodic Sync, as one made
// right after any read-back is.
const reuseReadFor = 5 * time.Second

// takeLastRead returns the dump ProxyPortsInKernel left for this Sync, if
// young enough, and forgets it.
func (r *Rules) takeLastRead() map[Table]savedTable {
	saved, at := r.lastRead, r.lastReadAt
	r.lastRead = nil
	if saved == nil || time.Since(at) > reuseReadFor {
		return nil
	}
	return saved
}

// PortalKey is what a ClusterIP, externalIP or LoadBalancer-IP portal
// matches: its service port (the rule comment), protocol, address and port.
type PortalKey struct {
	Name     string
	Protocol Protocol
	IP       netip.Addr
	Port     int
}

// KernelPortals is what the portal rules in the kernel say of proxy ports
// (ProxyPortsInKernel). A portal whose rules disagree (two ports) is left
// out of either map.
type KernelPortals struct {
	// Host is the proxy port each ClusterIP, externalIP and LB-IP portal
	// sends the node's own traffic to (KUBE-PORTALS-HOST; KUBE-NODEPORT-HOST,
	// a NodePort keyed as in Container): the cluster IP's socket, and that
	// of the shortcut of externalTrafficPolicy: Local for the others.
	Host map[PortalKey]int
	// Container is the proxy port each portal sends traffic from pods and
	// other hosts to (KUBE-PORTALS-CONTAINER; KUBE-NODEPORT-CONTAINER, a
	// NodePort keyed with no IP and its node port), source-matched rules
	// aside: under externalTrafficPolicy: Local, the node-local socket of
	// external addresses and NodePorts.
	Container map[PortalKey]int
}

// ProxyPortsInKernel reads the portals in the kernel (one dump). A proxy
// started over the rules of the one before it listens on those ports again
// where it can: the rules are then already right, so its first sync
// rewrites nothing for them, and clients reach the new sockets as soon as
// they listen, before any write.
//
// The next Sync, when it comes within reuseReadFor and no Update came
// first, works from this dump instead of reading its own (the proxier's
// first sync follows at once: 10,000 Services, one iptables-save of 22,000
// rules fewer on a restart).
func (r *Rules) ProxyPortsInKernel() (KernelPortals, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kp := KernelPortals{Host: map[PortalKey]int{}, Container: map[PortalKey]int{}}
	saved, err := r.readBack()
	if err != nil {
		return kp, err
	}
	r.lastRead, r.lastReadAt = saved, time.Now()
	nat := saved[TableNAT]
	host, container := portalPorts{kp.Host, map[PortalKey]bool{}}, portalPorts{kp.Container, map[PortalKey]bool{}}
	for chain, rules := range nat.rules {
		parent := portalChainOf(chain)
		if parent == "" {
			continue
		}
		for _, line := range rules {
			rule, ok := parsePortalRule(line)
			if !ok {
				continue
			}
			switch {
			case rule.fromSource || rule.key.Name == "" || rule.key.Port <= 0 ||
				(rule.key.Protocol != TCP && rule.key.Protocol != UDP):
			case parent == ChainNodePortContainer:
				rule.key.IP = netip.Addr{} // all node addresses, or --nodeport-addresses
				container.add(rule.key, rule.port)
			case parent == ChainNodePortHost:
				rule.key.IP = netip.Addr{}
				host.add(rule.key, rule.port)
			case rule.dstCIDR || !rule.key.IP.IsValid():
			case parent == ChainPortalsHost:
				host.add(rule.key, rule.port)
			case parent == ChainPortalsContainer:
				container.add(rule.key, rule.port)
			}
		}
	}
	return kp, nil
}

// portalPorts collects one map of KernelPortals, leaving out a portal
// whose rules name two ports.
type portalPorts struct {
	ports       map[PortalKey]int
	conflicting map[PortalKey]bool
}

func (pp portalPorts) add(key PortalKey, port int) {
	if pp.conflicting[key] {
		return
	}
	if had, seen := pp.ports[key]; seen && had != port {
		delete(pp.ports, key)
		pp.conflicting[key] = true
		return
	}
	pp.ports[key] = port
}

// portalChainOf is the chain of ours that sends traffic to proxy ports
// that chain is, or is a bucket of; "" for any other.
func portalChainOf(chain string) string {
	if parent, ok := bucketParent(TableNAT, chain); ok {
		chain = parent.name
	}
	switch chain {
	case ChainPortalsContainer, ChainPortalsHost, ChainNodePortContainer, ChainNodePortHost:
		return chain
	}
	return ""
}

// portalRule is what parsePortalRule reads of a rule.
type portalRule struct {
	key  PortalKey // IP: the -d address when one
	port int       // of the DNAT or REDIRECT target
	// fromSource: a -s match or a negation (the externalTrafficPolicy:
	// Local shortcut to the cluster-wide socket); dstCIDR: -d of more than
	// one address (--nodeport-addresses).
	fromSource, dstCIDR bool
}

// parsePortalRule reads a portal rule as rendered (renderPortal); ok is
// false when it has no proxy port target (1-65535) or cannot be read.
func parsePortalRule(line string) (portalRule, bool) {
	var r portalRule
	args, err := splitRule(line)
	if err != nil {
		return r, false
	}
	a := readRuleArgs(args)
	r.fromSource = a.src != "" || a.negated
	r.key.Protocol, r.key.Name = Protocol(a.proto), a.comment
	if a.dst != "" {
		p, err := netip.ParsePrefix(a.dst)
		switch {
		case err != nil:
			return r, false
		case p.IsSingleIP():
			r.key.IP = p.Addr()
		default:
			r.dstCIDR = true
		}
	}
	if a.dport != "" {
		if r.key.Port, err = strconv.Atoi(a.dport); err != nil {
			return r, false
		}
	}
	switch a.target {
	case "DNAT":
		ap, err := netip.ParseAddrPort(a.to)
		if err != nil {
			return r, false
		}
		r.port = int(ap.Port())
	case "REDIRECT":
		if r.port, err = strconv.Atoi(a.to); err != nil {
			return r, false
		}
	}
	return r, r.port > 0 && r.port <= 65535
}
