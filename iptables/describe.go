package iptables

import (
	"fmt"
	"strings"
)

// chainAudience says whose packets each of our chains sees, for Describe.
var chainAudience = map[string]string{
	ChainPortalsContainer:  "from pods and other hosts (PREROUTING)",
	ChainPortalsHost:       "sent by this node itself (OUTPUT)",
	ChainNodePortContainer: "from pods and other hosts (PREROUTING)",
	ChainNodePortHost:      "sent by this node itself (OUTPUT)",
}

// Describe says in one sentence what traffic one rule of ours catches and
// what it does with it. line is a rule as Render writes it ("-A CHAIN
// ..."). It reads the rule's own arguments, so it describes whatever the
// renderer wrote; a rule it cannot read is described as such.
func Describe(line string) string {
	args, err := splitRule(strings.TrimPrefix(line, "-A "))
	if err != nil || len(args) == 0 {
		return "not a rule"
	}
	chain := args[0]
	for _, table := range []Table{TableNAT, TableFilter} {
		if parent, ok := bucketParent(table, chain); ok {
			chain = parent.name // a bucket's rule reads as its chain's
		}
	}
	a := readRuleArgs(args[1:])
	proto, src, dst, dport, target, to := strings.ToUpper(a.proto), a.src, a.dst, a.dport, a.target, a.to
	notDNAT, portWord := a.notDNAT, "port"
	if a.dports != "" {
		// A guard rule's port list (guard.go): "1,3:5" reads "1, 3-5".
		dport = strings.ReplaceAll(strings.ReplaceAll(a.dports, ",", ", "), ":", "-")
		portWord = "ports"
	}
	host := strings.TrimSuffix(strings.TrimSuffix(dst, "/32"), "/128")
	action := ""
	switch target {
	case "REDIRECT":
		action = "redirects it to the proxy socket on port " + to + " of the address it arrived on"
		if chain == ChainPortalsHost || chain == ChainNodePortHost {
			// A packet the node sends itself arrived on no interface: the
			// kernel redirects it to the loopback address.
			switch {
			case strings.Contains(dst, ":"):
				action = "redirects it to the proxy socket [::1]:" + to + " (loopback: REDIRECT of the node's own traffic)"
			case dst != "":
				action = "redirects it to the proxy socket 127.0.0.1:" + to + " (loopback: REDIRECT of the node's own traffic)"
			default:
				action = "redirects it to the proxy socket on port " + to + " of the loopback address, 127.0.0.1 or ::1 (REDIRECT of the node's own traffic)"
			}
		}
	case "DNAT":
		action = "rewrites its destination to the proxy socket " + to
	case "ACCEPT":
		action = "accepts it"
	case "DROP":
		action = "drops it"
	case "REJECT":
		action = "refuses it, as where nothing listens"
	default:
		action = "jumps to " + target
	}
	audience := chainAudience[chain]
	if src != "" {
		audience = "from pods in " + src + " (--cluster-cidr, PREROUTING)"
	}
	if isBucket(TableNAT, target) || isBucket(TableFilter, target) {
		return fmt.Sprintf("every packet of %s %s goes on through %s, one of %d buckets holding this chain's rules by Service port", chain, audience, target, numBuckets)
	}
	switch chain {
	case ChainPortalsContainer, ChainPortalsHost:
		return fmt.Sprintf("%s to the service address %s port %s %s: %s", proto, host, dport, audience, action)
	case ChainNodePortContainer, ChainNodePortHost:
		where := "any local address"
		switch {
		case dst != "":
			where = "a local address in " + dst
		case a.notDst != "":
			where = "any local address but " + strings.TrimSuffix(a.notDst, "/128")
		}
		return fmt.Sprintf("%s to node port %s on %s, %s: %s", proto, dport, where, audience, action)
	case ChainNodePortNonLocal:
		if name, ok := strings.CutSuffix(a.comment, healthCheckComment); ok {
			where := "any local address"
			switch {
			case dst != "":
				where = "a local address in " + dst
			case a.notDst != "":
				where = "any local address but " + strings.TrimSuffix(a.notDst, "/128")
			}
			return fmt.Sprintf("%s to healthCheckNodePort %s on %s, where load balancers check %s (filter INPUT): %s when it opens a connection, even where the node's firewall drops by default", proto, dport, where, name, action)
		}
		return fmt.Sprintf("%s to proxy port %s after a node port rule sent it there (filter INPUT): %s when it opens a connection, even where the node's firewall drops by default (the packets after it are the firewall's established-traffic rule's)", proto, dport, action)
	case ChainPortalsNonLocal:
		return fmt.Sprintf("%s to proxy %s %s after a service address rule sent it there (filter INPUT, a connection's first packet): %s, even where the node's firewall drops by default", proto, portWord, dport, action)
	case ChainProxyPortReject:
		return fmt.Sprintf("%s to proxy %s %s that a portal sent there and no accept above took (filter INPUT, a connection's first packet): %s; reached only while no proxy serves (a stopping proxy flushes the accepts), so another local process that binds the port gets nothing", proto, portWord, dport, action)
	case ChainLBSourceRanges:
		to := fmt.Sprintf("%s to the LoadBalancer IP %s port %s (filter INPUT, where its portal delivered it)", proto, a.origDst, a.origDport)
		if target == "RETURN" {
			return fmt.Sprintf("%s from %s: allows it (loadBalancerSourceRanges)", to, src)
		}
		return fmt.Sprintf("%s from any source not allowed above: %s (loadBalancerSourceRanges)", to, action)
	case ChainProxyPortGuard:
		if notDNAT {
			noBackDoor := "the proxy port is"
			if portWord == "ports" {
				noBackDoor = "these proxy ports are"
			}
			return fmt.Sprintf("%s straight to proxy %s %s that did not come through a rule above (filter INPUT): %s, so %s no back door", proto, portWord, dport, action, noBackDoor)
		}
		return fmt.Sprintf("%s to proxy %s %s (filter INPUT): %s", proto, portWord, dport, action)
	}
	return fmt.Sprintf("%s rule in %s: %s", proto, chain, action)
}

func isBucket(table Table, chain string) bool {
	_, ok := bucketParent(table, chain)
	return ok
}
