package iptables

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Table is an iptables table name.
type Table string

const (
	TableNAT    Table = "nat"
	TableFilter Table = "filter"
)

// Names of the chains we own. The first five keep the legacy userspace
// kube-proxy names so existing tooling recognises them; the guard, the
// loadBalancerSourceRanges firewall, the portals' accept and the reject of
// portal traffic no running proxy accepts are ours.
const (
	ChainPortalsContainer  = "KUBE-PORTALS-CONTAINER"
	ChainPortalsHost       = "KUBE-PORTALS-HOST"
	ChainNodePortContainer = "KUBE-NODEPORT-CONTAINER"
	ChainNodePortHost      = "KUBE-NODEPORT-HOST"
	ChainNodePortNonLocal  = "KUBE-NODEPORT-NON-LOCAL"
	ChainProxyPortGuard    = "KUBE-PROXY-PORT-GUARD"
	ChainLBSourceRanges    = "KUBE-LB-SOURCE-RANGES"
	ChainPortalsNonLocal   = "KUBE-PORTALS-NON-LOCAL"
	ChainProxyPortReject   = "KUBE-PROXY-PORT-REJECT"
)

// ownedChain is one chain we create and whose whole contents we write.
type ownedChain struct {
	table Table
	name  string
}

// ownedChains lists our chains in render order (nat before filter, as
// iptables-save prints tables in that order too).
var ownedChains = []ownedChain{
	{TableNAT, ChainPortalsContainer},
	{TableNAT, ChainPortalsHost},
	{TableNAT, ChainNodePortContainer},
	{TableNAT, ChainNodePortHost},
	{TableFilter, ChainNodePortNonLocal},
	{TableFilter, ChainProxyPortGuard},
	{TableFilter, ChainLBSourceRanges},
	{TableFilter, ChainPortalsNonLocal},
	{TableFilter, ChainProxyPortReject},
}

// jump is one rule in a built-in chain that sends packets into one of ours.
type jump struct {
	table Table
	from  string // built-in chain
	to    string // our chain
	// first jumps go to the top of the built-in chain, in the order they
	// appear in jumps; the others are appended.
	first bool
	// refuses: a jump whose chain refuses traffic, which must never sit
	// above the jumps before it (their accepts would not be reached);
	// where its predecessor cannot be located (printed in another
	// spelling), it is appended instead of going to the top.
	refuses bool
	comment string
	match   []string // extra match arguments, before -j
}

// spec is the rule as passed to iptables -C/-I/-A/-D, in the order
// iptables-save prints it, so a saved line can be compared as text.
func (j jump) spec() []string {
	args := []string{"-m", "comment", "--comment", j.comment}
	args = append(args, j.match...)
	return append(args, "-j", j.to)
}

// ctStateNew sends only a connection's first packet through a chain: what
// it decides holds for the rest of the connection.
var ctStateNew = []string{"-m", "conntrack", "--ctstate", "NEW"}

// addrTypeLocal restricts NodePort chains to packets for a local address.
var addrTypeLocal = []string{"-m", "addrtype", "--dst-type", "LOCAL"}

// jumps is the single table of jump rules, used by Sync to install them and
// by Cleanup to remove them. Order matters for first jumps: the guard and
// the source-range firewall must come before KUBE-NODEPORT-NON-LOCAL and
// KUBE-PORTALS-NON-LOCAL, whose ACCEPTs would otherwise let direct
// connections to proxy ports (and LoadBalancer traffic from outside its
// ranges) through; the reject chain must come after both accept chains,
// which a stopped proxy flushes (Rules.Stop); the portal chains are
// first so they win over any later NAT rule, and NodePorts are last so a
// portal on a local address beats a NodePort with the same port.
var jumps = []jump{
	{table: TableFilter, from: "INPUT", to: ChainProxyPortGuard, first: true,
		comment: "kube-userspace-proxy: drop connections to proxy ports that bypassed a portal"},
	{table: TableFilter, from: "INPUT", to: ChainLBSourceRanges, first: true,
		comment: "kube-userspace-proxy: loadBalancerSourceRanges", match: ctStateNew},
	{table: TableFilter, from: "INPUT", to: ChainNodePortNonLocal, first: true,
		comment: "kube-userspace-proxy: accept NodePort traffic to proxy ports"},
	{table: TableFilter, from: "INPUT", to: ChainPortalsNonLocal, first: true,
		comment: "kube-userspace-proxy: accept portal traffic to proxy ports", match: ctStateNew},
	{table: TableFilter, from: "INPUT", to: ChainProxyPortReject, first: true, refuses: true,
		comment: "kube-userspace-proxy: reject portal traffic to proxy ports no running proxy accepts", match: ctStateNew},
	{table: TableNAT, from: "PREROUTING", to: ChainPortalsContainer, first: true,
		comment: "kube-userspace-proxy: service portals"},
	{table: TableNAT, from: "OUTPUT", to: ChainPortalsHost, first: true,
		comment: "kube-userspace-proxy: service portals"},
	{table: TableNAT, from: "PREROUTING", to: ChainNodePortContainer,
		comment: "kube-userspace-proxy: service NodePorts; must be last", match: addrTypeLocal},
	{table: TableNAT, from: "OUTPUT", to: ChainNodePortHost,
		comment: "kube-userspace-proxy: service NodePorts; must be last", match: addrTypeLocal},
}

// Buckets. iptables-nft fetches every rule of a chain that a restore's -D
// or -I edits: 110-170 ms per change in a chain of 10,000 rules, 10 ms in
// one of 150. So a chain of ours that would hold more than bucketAbove
// rules holds instead one jump to each of numBuckets sub-chains, CHAIN-00
// to CHAIN-63, and each rule sits, in order, in the sub-chain of its
// Service port (a hash of the name): a change edits one small chain.
// Smaller chains keep the legacy layout. Across buckets the order is by
// bucket, which matters only when two Services claim the same address and
// port (the first rule wins either way, only which one is first differs).
const (
	numBuckets         = 64
	defaultBucketAbove = 1024
)

// bucketChain names bucket b of parent.
func bucketChain(parent string, b int) string {
	if names, ok := bucketNames[parent]; ok {
		return names[b]
	}
	return fmt.Sprintf("%s-%02d", parent, b)
}

// bucketNames holds the bucket names of our chains, built once: renders
// and diffs name every bucket several times.
var bucketNames = func() map[string][numBuckets]string {
	out := map[string][numBuckets]string{}
	for _, c := range ownedChains {
		var names [numBuckets]string
		for b := range names {
			names[b] = fmt.Sprintf("%s-%02d", c.name, b)
		}
		out[c.name] = names
	}
	return out
}()

// bucketOf is the bucket of a Service port's rules (FNV-1a of its name).
func bucketOf(name string) uint8 {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= 16777619
	}
	return uint8(h % numBuckets)
}

// bucketParent returns the chain of ours that a bucket chain belongs to,
// or false when name is not one of our bucket chains.
func bucketParent(table Table, name string) (ownedChain, bool) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 || len(name)-i != 3 {
		return ownedChain{}, false
	}
	n, err := strconv.Atoi(name[i+1:])
	if err != nil || n < 0 || n >= numBuckets || bucketChain(name[:i], n) != name {
		return ownedChain{}, false
	}
	parent := ownedChain{table, name[:i]}
	return parent, slices.Contains(ownedChains, parent)
}

// renderedChains lists the chains of want in render order: each of ours, then
// its buckets, if any.
func renderedChains(want chainRules) []ownedChain {
	out := make([]ownedChain, 0, len(want))
	for _, c := range ownedChains {
		out = append(out, c)
		for b := range numBuckets {
			if name := bucketChain(c.name, b); hasChain(want, name) {
				out = append(out, ownedChain{c.table, name})
			}
		}
	}
	return out
}

func hasChain(want chainRules, name string) bool {
	_, ok := want[name]
	return ok
}

// SetBucketAbove sets the rule count past which a chain is split into
// buckets (defaultBucketAbove unless set), so that tests of other packages
// move chains in and out of buckets without building 1,024 rules.
func (r *Rules) SetBucketAbove(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bucketAbove = n
}
