package iptables

// Table is an iptables table name.
type Table string

const (
	TableNAT    Table = "nat"
	TableFilter Table = "filter"
)

// Names of the chains we own. The first five keep the legacy userspace
// kube-proxy names so existing tooling recognises them; the guard is ours.
const (
	ChainPortalsContainer  = "KUBE-PORTALS-CONTAINER"
	ChainPortalsHost       = "KUBE-PORTALS-HOST"
	ChainNodePortContainer = "KUBE-NODEPORT-CONTAINER"
	ChainNodePortHost      = "KUBE-NODEPORT-HOST"
	ChainNodePortNonLocal  = "KUBE-NODEPORT-NON-LOCAL"
	ChainProxyPortGuard    = "KUBE-PROXY-PORT-GUARD"
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
}

// jump is one rule in a built-in chain that sends packets into one of ours.
type jump struct {
	table Table
	from  string // built-in chain
	to    string // our chain
	// first jumps go to the top of the built-in chain, in the order they
	// appear in jumps; the others are appended.
	first   bool
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

// addrTypeLocal restricts NodePort chains to packets for a local address.
var addrTypeLocal = []string{"-m", "addrtype", "--dst-type", "LOCAL"}

// jumps is the single table of jump rules, used by Sync to install them and
// by Cleanup to remove them. Order matters for first jumps: the guard must
// come before KUBE-NODEPORT-NON-LOCAL, whose ACCEPTs would otherwise let
// direct connections to NodePort proxy ports through; the portal chains are
// first so they win over any later NAT rule, and NodePorts are last so a
// portal on a local address beats a NodePort with the same port.
var jumps = []jump{
	{table: TableFilter, from: "INPUT", to: ChainProxyPortGuard, first: true,
		comment: "kube-userspace-proxy: drop connections to proxy ports that bypassed a portal"},
	{table: TableFilter, from: "INPUT", to: ChainNodePortNonLocal, first: true,
		comment: "kube-userspace-proxy: accept NodePort traffic to proxy ports"},
	{table: TableNAT, from: "PREROUTING", to: ChainPortalsContainer, first: true,
		comment: "kube-userspace-proxy: service portals"},
	{table: TableNAT, from: "OUTPUT", to: ChainPortalsHost, first: true,
		comment: "kube-userspace-proxy: service portals"},
	{table: TableNAT, from: "PREROUTING", to: ChainNodePortContainer,
		comment: "kube-userspace-proxy: service NodePorts; must be last", match: addrTypeLocal},
	{table: TableNAT, from: "OUTPUT", to: ChainNodePortHost,
		comment: "kube-userspace-proxy: service NodePorts; must be last", match: addrTypeLocal},
}
