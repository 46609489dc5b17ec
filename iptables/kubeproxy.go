package iptables

import (
	"slices"
	"strings"

	"github.com/google/nftables"
	"k8s.io/klog/v2"
)

// kubeProxyServices is the nat chain kube-proxy's iptables and ipvs modes
// take Service traffic into, jumped to from PREROUTING and OUTPUT. A jump
// to it that outlived kube-proxy (no `kube-proxy --cleanup`, or one run
// with the image of the other backend) DNATs Service traffic to the pod
// IPs it last knew before this proxy's portals see it: in the other
// backend always (its nat hook decides first, and nat is decided once per
// connection); in this one the NodePorts its KUBE-NODEPORTS lists wherever
// the jump is (KUBE-SERVICES ends in a jump there, and our NodePort jumps
// come last in the chain), the rest when it sorts before our portals'
// jump. The proxy's /healthz is 200 all the same: only a log line can say
// it.
const kubeProxyServices = "KUBE-SERVICES"

// kubeProxyJumps returns the rules of nat's PREROUTING and OUTPUT that
// jump to kube-proxy's KUBE-SERVICES, as iptables-save prints them.
func kubeProxyJumps(nat savedTable) []string {
	var out []string
	for _, chain := range []string{"PREROUTING", "OUTPUT"} {
		for _, rule := range nat.rules[chain] {
			if ruleTarget(rule) == kubeProxyServices {
				out = append(out, "-A "+chain+" "+rule)
			}
		}
	}
	return out
}

// warnKubeProxyJumps logs an error naming kube-proxy's jumps found in
// backend (command: the iptables command that removes them), and how to
// remove them: each as a command ready to paste (iptables-save quotes a
// comment as a shell does).
func warnKubeProxyJumps(f Family, backend, command string, jumps []string) {
	remove := make([]string, len(jumps))
	for i, j := range jumps {
		remove[i] = command + " -t nat -D " + strings.TrimPrefix(j, "-A ")
	}
	klog.ErrorS(nil, "kube-proxy's rules are in place: its KUBE-SERVICES chain sends Service traffic to the endpoints it last knew before this proxy's portals see it (from the other backend all of it; from this one the NodePorts it still lists wherever its jump is, as this proxy's NodePort jumps come last, and ClusterIPs, external and LoadBalancer IPs when its jump comes first) (kube-proxy still running, or stopped without `kube-proxy --cleanup`); stop kube-proxy and run `kube-proxy --cleanup` with the image of that backend, or delete the jumps",
		"family", f, "backend", backend, "jumps", jumps, "remove", remove)
}

// noteKubeProxy says, once per change, what a read-back of this proxy's
// backend finds of kube-proxy's jumps: found at start, or added later (a
// kube-proxy DaemonSet left in place), and when they are gone.
func (r *Rules) noteKubeProxy(nat savedTable) {
	jumps := kubeProxyJumps(nat)
	if slices.Equal(jumps, r.kubeProxyJumps) {
		return
	}
	r.kubeProxyJumps = jumps
	command := "iptables"
	if r.cfg.Family == IPv6 {
		command = "ip6tables"
	}
	if len(jumps) == 0 {
		klog.InfoS("kube-proxy's jumps to KUBE-SERVICES are gone", "family", r.cfg.Family)
		return
	}
	backend := "in use"
	if er, ok := r.runner.(*execRunner); ok {
		backend = "legacy"
		if er.nftables {
			backend = "nf_tables"
		}
	}
	warnKubeProxyJumps(r.cfg.Family, backend, command, jumps)
}

// kubeProxyNftTable is the table of kube-proxy's nftables mode, one per
// family ("table ip kube-proxy", "table ip6 kube-proxy"). Left in place (no
// `kube-proxy --cleanup`, or kube-proxy still running) it acts before this
// proxy's portals: its filter chains at priority dstnat-10 reject the
// Services that had no endpoints at its last sync (and drop what
// loadBalancerSourceRanges kept out) before any nat rule, and its nat
// chains share the priority of iptables-nft's nat chains, where of two
// hooks of one priority the one registered last runs first: a table made
// after our nat chains (kube-proxy still running, or a node whose nat
// PREROUTING an earlier tool made) DNATs Service traffic to the pod IPs it
// last knew. In a namespace by hand, each case failed 10 of 10
// connections to a ClusterIP, with /healthz 200 and no line in the log.
const kubeProxyNftTable = "kube-proxy"

// nftTableLister is a Runner that can list the node's nftables tables of
// its family (ip for IPv4, ip6 for IPv6): the real one, and FakeRunner.
type nftTableLister interface {
	ListNftTables() ([]string, error)
}

// ListNftTables lists the nftables tables of the runner's family through
// netlink, in the network namespace of the calling OS thread, as the
// commands run. It needs CAP_NET_ADMIN, as iptables does.
func (r *execRunner) ListNftTables() ([]string, error) {
	family := nftables.TableFamilyIPv4
	if r.family == IPv6 {
		family = nftables.TableFamilyIPv6
	}
	conn, err := nftables.New()
	if err != nil {
		return nil, err
	}
	tables, err := conn.ListTablesOfFamily(family)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.Name
	}
	return names, nil
}

// noteKubeProxyNft says, once per change, whether kube-proxy's nftables
// table of this family is there (kubeProxyNftTable), with the command that
// removes it, and when it is gone. A runner that cannot list nftables
// tables, or a listing that fails (a kernel without nf_tables), says
// nothing: there is no such table to find.
func (r *Rules) noteKubeProxyNft() {
	lister, ok := r.runner.(nftTableLister)
	if !ok {
		return
	}
	tables, err := lister.ListNftTables()
	if err != nil {
		klog.V(2).InfoS("Could not list the nftables tables to look for kube-proxy's", "family", r.cfg.Family, "err", err)
		return
	}
	found := slices.Contains(tables, kubeProxyNftTable)
	if found == r.kubeProxyNftTable {
		return
	}
	r.kubeProxyNftTable = found
	table := "ip " + kubeProxyNftTable
	if r.cfg.Family == IPv6 {
		table = "ip6 " + kubeProxyNftTable
	}
	if !found {
		klog.InfoS("kube-proxy's nftables table is gone", "family", r.cfg.Family, "table", table)
		return
	}
	klog.ErrorS(nil, "kube-proxy's nftables table is in place: it rejects Service traffic to the Services that had no endpoints at its last sync before this proxy's portals see it, and sends traffic to the endpoints it last knew when its chains were made after this proxy's (kube-proxy in nftables mode still running, or stopped without `kube-proxy --cleanup`); stop kube-proxy and run `kube-proxy --cleanup`, or delete the table",
		"family", r.cfg.Family, "table", table, "remove", "nft delete table "+table)
}
