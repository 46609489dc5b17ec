package iptables

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// guardBlock is how many consecutive port numbers share one guard rule.
// A rule per proxy port made the guard chain as long as the Service list:
// 10,000 rules cost the first sync 0.3 s of iptables-restore alone, and
// proxy ports sit mostly next to each other (the default allocator fills
// the ports above the ephemeral range first: about 2,000 rules for 10,000
// ports; 625 when they are consecutive). Grouping by a fixed block of the port number,
// not by runs of the sorted list, keeps every other rule unchanged when a
// port comes or goes, so Update edits one rule. Sixteen numbers never need
// more than the 15 ports (a range counting two) one multiport match takes:
// the worst, runs of two apart by one, needs 11.
const guardBlock = 16

// guardGroupAbove is the number of proxy ports up to which the guard keeps
// the legacy layout, one rule per port (what tooling and people reading
// iptables-save expect of a small node); above it ports are grouped by
// block. Either way costs little below it: 256 rules restore in ~8 ms.
const guardGroupAbove = 256

// guardConntrack ends every guard rule. REDIRECT sets the conntrack DNAT
// status too, so everything that came through a portal passes; a direct
// connection to the proxy port does not. Only NEW flows are judged: the
// rules outlive the proxy, and a node connection that later got a former
// proxy port as its source port must still receive its replies.
const guardConntrack = " -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -j DROP"

// nonLocalConntrack ends a KUBE-NODEPORT-NON-LOCAL rule: it accepts a NodePort's
// NEW connections to its proxy port, or a healthCheckNodePort's, past an
// INPUT policy that drops.
const nonLocalConntrack = " -m conntrack --ctstate NEW -j ACCEPT"

// healthCheckComment follows the Service port's name in the comment of the
// accept of its healthCheckNodePort (Portal.HealthCheck), in
// KUBE-NODEPORT-NON-LOCAL too: kube-proxy's comment on its rule.
const healthCheckComment = " health check node port"

// portalsAccept ends a KUBE-PORTALS-NON-LOCAL rule. Its jump takes only
// NEW connections, and the guard before it has dropped those that did not
// come through a portal.
const portalsAccept = " -j ACCEPT"

// guardRules renders the guard chain for the proxy ports in keys (in any
// order, repeats allowed), in port order: one rule per port up to
// guardGroupAbove ports, else one per protocol and block of guardBlock port
// numbers (the single-port form where a block holds one port); and each
// rule's bucket (chains.go), a hash of its port or block.
func guardRules(keys []guardKey) ([]string, []uint8) {
	keys = sortedGuardKeys(keys)
	return guardRuleSet(keys, len(keys) > guardGroupAbove)
}

// portalsAcceptRules renders KUBE-PORTALS-NON-LOCAL from the guard's
// rules: the same ports in the same grouping (and buckets), accepted. A
// portal's DNAT (or REDIRECT) hands its connection to INPUT, which on a
// node whose policy drops dropped it: only NodePorts were accepted, by
// KUBE-NODEPORT-NON-LOCAL, as in the legacy proxier (kube-proxy's iptables
// mode forwards that traffic and never meets INPUT). Every guarded port
// is accepted, since the guard before it has dropped what no portal sent;
// derived from the rendered guard, it costs no second sort of the ports
// (rendered apart, it took a Service change at 10,000 Services from 15 to
// 24 ms).
func portalsAcceptRules(guard []string) []string {
	out := make([]string, len(guard))
	for i, rule := range guard {
		out[i] = strings.TrimSuffix(rule, guardConntrack) + portalsAccept
	}
	return out
}

// portalsRejectRules renders KUBE-PROXY-PORT-REJECT from the guard's
// rules: the same ports, rejected as a closed port is (a TCP reset, an
// ICMP port unreachable), which is what a client meets when nothing
// listens. Its jump comes after both accept chains, so while the proxy
// runs no packet reaches it; a stopped proxy flushes the accepts (Stop),
// and until its successor's first sync writes them back, portal traffic
// is refused instead of handed to whoever binds a proxy port the portals
// still name (the guard drops only what bypassed a portal).
func (r *Rules) portalsRejectRules(guard []string) []string {
	unreachable := " -j REJECT --reject-with icmp-port-unreachable"
	if r.cfg.Family == IPv6 {
		unreachable = " -j REJECT --reject-with icmp6-port-unreachable"
	}
	out := make([]string, len(guard))
	for i, rule := range guard {
		rule = strings.TrimSuffix(rule, guardConntrack)
		if strings.HasPrefix(rule, "-p tcp ") {
			out[i] = rule + " -j REJECT --reject-with tcp-reset"
		} else {
			out[i] = rule + unreachable
		}
	}
	return out
}

// sortedGuardKeys sorts keys by protocol and port and drops repeats.
func sortedGuardKeys(keys []guardKey) []guardKey {
	slices.SortFunc(keys, func(a, b guardKey) int {
		return cmp.Or(strings.Compare(string(a.proto), string(b.proto)), cmp.Compare(a.port, b.port))
	})
	return slices.Compact(keys)
}

// guardRuleSet is guardRules on sorted, distinct keys, grouped or not.
func guardRuleSet(keys []guardKey, grouped bool) ([]string, []uint8) {
	size := 1
	if grouped {
		size = guardBlock
	}
	var rules []string
	var buckets []uint8
	for len(keys) > 0 {
		block := keys[0].port / size
		n := 1
		for n < len(keys) && keys[n].proto == keys[0].proto && keys[n].port/size == block {
			n++
		}
		proto := string(keys[0].proto)
		rules = append(rules, guardRule(proto, keys[:n]))
		buckets = append(buckets, bucketOf(proto+"/"+strconv.Itoa(block)))
		keys = keys[n:]
	}
	return rules, buckets
}

// guardRule is the rule for sorted, distinct ports of one protocol.
func guardRule(proto string, ports []guardKey) string {
	if len(ports) == 1 {
		return "-p " + proto + " -m " + proto + " --dport " + strconv.Itoa(ports[0].port) + guardConntrack
	}
	b := make([]byte, 0, 2*len(proto)+32+6*len(ports)+len(guardConntrack))
	b = append(append(append(b, "-p "...), proto...), " -m multiport --dports "...)
	for i := 0; i < len(ports); {
		j := i + 1
		for j < len(ports) && ports[j].port == ports[j-1].port+1 {
			j++
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(ports[i].port), 10)
		if j-i > 1 {
			b = append(b, ':')
			b = strconv.AppendInt(b, int64(ports[j-1].port), 10)
		}
		i = j
	}
	return string(append(b, guardConntrack...))
}

// GuardRuleCovering returns the line of restore input (as Render writes
// it) whose rule in chain (the guard, or KUBE-PORTALS-NON-LOCAL or
// KUBE-PROXY-PORT-REJECT, which are grouped alike) covers port of proto, or "" when none does: a Service's
// own rendering shows its port's rule alone, while the kernel holds the
// rule of its whole block.
func GuardRuleCovering(input []byte, chain string, proto Protocol, port int) string {
	for line := range strings.Lines(string(input)) {
		line = strings.TrimSuffix(line, "\n")
		c, rule, _ := strings.Cut(strings.TrimPrefix(line, "-A "), " ")
		if !strings.HasPrefix(line, "-A ") || !strings.HasPrefix(c, chain) {
			continue
		}
		if p, ports, _, ok := GuardRulePorts(rule); ok && p == proto && slices.Contains(ports, port) {
			return line
		}
	}
	return ""
}

// GuardRulePorts reads a guard rule (without "-A CHAIN"): its protocol,
// the ports it covers in order, and what follows the port list; ok is
// false for a rule of another shape.
func GuardRulePorts(rule string) (proto Protocol, ports []int, rest string, ok bool) {
	f := strings.Fields(rule)
	i := slices.IndexFunc(f, func(a string) bool { return a == "--dport" || a == "--dports" })
	if len(f) < 2 || f[0] != "-p" || i < 0 || i+1 >= len(f) {
		return "", nil, "", false
	}
	for part := range strings.SplitSeq(f[i+1], ",") {
		lo, hi, isRange := strings.Cut(part, ":")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a > b {
			return "", nil, "", false
		}
		for p := a; p <= b; p++ {
			ports = append(ports, p)
		}
	}
	return Protocol(f[1]), ports, strings.Join(f[i+2:], " "), true
}
