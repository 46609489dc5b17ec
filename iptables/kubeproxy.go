package iptables

import (
	"slices"
	"strings"

	"k8s.io/klog/v2"
)

// kubeProxyServices is the nat chain kube-proxy's iptables and ipvs modes
// take Service traffic into, jumped to from PREROUTING and OUTPUT. A jump
// to it that outlived kube-proxy (no `kube-proxy --cleanup`, or one run
// with the image of the other backend) DNATs Service traffic to the pod
// IPs it last knew before this proxy's portals see it: in the other
// backend always (its nat hook decides first, and nat is decided once per
// connection), in this one when it sorts before our jumps. The proxy's
// /healthz is 200 all the same: only a log line can say it.
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
	klog.ErrorS(nil, "kube-proxy's rules are in place: its KUBE-SERVICES chain sends Service traffic to the endpoints it last knew before this proxy's portals see it (always from the other backend; from this one when its jump comes first) (kube-proxy still running, or stopped without `kube-proxy --cleanup`); stop kube-proxy and run `kube-proxy --cleanup` with the image of that backend, or delete the jumps",
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
