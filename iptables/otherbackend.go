package iptables

import (
	"bytes"
	"os/exec"
	"strings"

	"k8s.io/klog/v2"
)

// The node's iptables has two backends, nf_tables and legacy, each with its
// own tables; the kernel runs both. Rules of ours left in the backend this
// proxy does not use (an image built for the other one ran here before)
// keep sending Service traffic to old proxy ports, and neither a sync nor
// --cleanup sees them. kube-proxy's images pick the backend that already
// holds rules (iptables-wrapper); here the backend is the image's, so the
// other one is only looked at, and what it holds of ours is reported.

// otherBackendSave runs the other backend's save command for family and
// returns its output; a variable, so tests feed a dump. ok is false when
// the node has no such command.
var otherBackendSave = func(f Family, nftables bool) ([]byte, bool) {
	name := "iptables"
	if f == IPv6 {
		name = "ip6tables"
	}
	if nftables {
		name += "-legacy-save"
	} else {
		name += "-nft-save"
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return nil, false
	}
	out, err := exec.Command(path).Output()
	if err != nil {
		return nil, false
	}
	return out, true
}

// OtherBackendChains lists the chains of ours ("nat/KUBE-PORTALS-HOST")
// that the backend r does not use holds, and that backend's name; nil when
// it holds none or cannot be read.
func OtherBackendChains(r Runner) (backend string, chains []string) {
	er, ok := r.(*execRunner)
	if !ok {
		return "", nil
	}
	return otherBackendChains(er.family, er.nftables)
}

func otherBackendChains(f Family, nftables bool) (string, []string) {
	backend, chains, _ := otherBackendRules(f, nftables)
	return backend, chains
}

// otherBackendRules reads the other backend once: the chains of ours it
// holds, and kube-proxy's jumps in its nat table (kubeProxyJumps).
func otherBackendRules(f Family, nftables bool) (backend string, chains, kubeProxy []string) {
	backend = "nf_tables"
	if nftables {
		backend = "legacy"
	}
	out, ok := otherBackendSave(f, nftables)
	if !ok {
		return backend, nil, nil
	}
	if nat, err := parseSave(out, TableNAT); err == nil {
		kubeProxy = kubeProxyJumps(nat)
	}
	table := ""
	for _, line := range bytes.Split(out, []byte("\n")) {
		l := string(line)
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, ":"):
			name, _, _ := strings.Cut(l[1:], " ")
			if isOwned(Table(table), name) {
				chains = append(chains, table+"/"+name)
			}
		}
	}
	return backend, chains, kubeProxy
}

// WarnOtherBackend logs an error when the backend r does not use holds
// chains of ours, with the command that removes them, and one when it
// holds kube-proxy's jumps (kubeProxyServices), with the commands that
// remove them.
func WarnOtherBackend(r Runner) {
	er, ok := r.(*execRunner)
	if !ok {
		return
	}
	backend, chains, kubeProxy := otherBackendRules(er.family, er.nftables)
	cmd := "iptables"
	if r.Family() == IPv6 {
		cmd = "ip6tables"
	}
	if backend == "legacy" {
		cmd += "-legacy"
	} else {
		cmd += "-nft"
	}
	if len(kubeProxy) > 0 {
		warnKubeProxyJumps(r.Family(), backend, cmd, kubeProxy)
	}
	if len(chains) == 0 {
		return
	}
	klog.ErrorS(nil, "The other iptables backend holds chains of this proxy (a run with an image built for that backend left them): their portals still send Service traffic to old proxy ports, and this proxy neither syncs nor cleans that backend; remove them with "+cmd+" (its -save shows them), or with --cleanup from an image of that backend",
		"family", r.Family(), "backend", backend, "chains", chains)
}
