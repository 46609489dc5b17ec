package iptables

import (
	"bytes"
	"fmt"
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
	warnOtherBackend(r.Family(), backend, chains, kubeProxy)
}

func warnOtherBackend(f Family, backend string, chains, kubeProxy []string) {
	if len(kubeProxy) > 0 {
		warnKubeProxyJumps(f, backend, otherBackendCommand(f, backend), kubeProxy)
	}
	if len(chains) == 0 {
		return
	}
	klog.ErrorS(nil, "The other iptables backend holds chains of this proxy (a run with an image built for that backend left them): their portals still send Service traffic to old proxy ports, and this proxy does not sync that backend; remove them with --cleanup (it cleans both backends; a proxy running meanwhile puts its own rules back as soon as it ends), or by hand with "+otherBackendCommand(f, backend)+" (its -save shows them)",
		"family", f, "backend", backend, "chains", chains)
}

// otherBackendCommand is the command of backend ("legacy", "nf_tables")
// for family f: iptables-legacy, ip6tables-nft, ...
func otherBackendCommand(f Family, backend string) string {
	cmd := "iptables"
	if f == IPv6 {
		cmd = "ip6tables"
	}
	if backend == "legacy" {
		return cmd + "-legacy"
	}
	return cmd + "-nft"
}

// cleanupOtherBackend removes the chains of ours (and our jumps to them)
// that the backend r does not use holds, through that backend's commands
// (the image ships both): --cleanup reached only its own backend, and
// their portals went on sending Service traffic to old proxy ports until
// someone removed them by hand. kube-proxy's jumps there are only said
// (kube-proxy's --cleanup is theirs). Without the other backend's
// commands, they are said as at start.
func cleanupOtherBackend(r Runner) error {
	er, ok := r.(*execRunner)
	if !ok {
		return nil
	}
	backend, chains, kubeProxy := otherBackendRules(er.family, er.nftables)
	if len(chains) == 0 {
		warnOtherBackend(er.family, backend, nil, kubeProxy)
		return nil
	}
	command := "nft"
	if backend == "legacy" {
		command = "legacy"
	}
	other, err := newExecRunner(er.family, command)
	if err != nil {
		warnOtherBackend(er.family, backend, chains, kubeProxy)
		return nil
	}
	warnOtherBackend(er.family, backend, nil, kubeProxy)
	klog.InfoS("Cleaning up the chains of this proxy in the other iptables backend", "family", er.family, "backend", backend, "chains", chains)
	if err := Cleanup(other); err != nil {
		return fmt.Errorf("%s backend: %w", backend, err)
	}
	return nil
}
