package iptables

import (
	"os/exec"
	"strings"
	"testing"
)

// Chains of ours in the other iptables backend (an image built for it ran
// here before) kept sending Service traffic to old proxy ports: --cleanup
// only said so, and they had to be removed by hand. It now removes them
// through that backend's commands, its own backend's as before, and
// leaves the other backend's foreign rules alone.
func TestKernelCleanupAllCleansTheOtherBackend(t *testing.T) {
	requireRealIptables(t)
	version, err := exec.Command("iptables", "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	other := "iptables-legacy"
	if !strings.Contains(string(version), "nf_tables") {
		other = "iptables-nft"
	}
	for _, bin := range []string{other, other + "-save", other + "-restore"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s: %v", bin, err)
		}
	}
	ns := newNetns(t)
	for _, args := range [][]string{
		{"-t", "nat", "-N", ChainPortalsContainer},
		{"-t", "nat", "-I", "PREROUTING", "1", "-m", "comment", "--comment", "kube-userspace-proxy: service portals", "-j", ChainPortalsContainer},
		{"-t", "nat", "-A", ChainPortalsContainer, "-d", "10.96.0.10/32", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.0.0.1:61000"},
		{"-t", "filter", "-N", ChainProxyPortGuard},
		{"-t", "filter", "-I", "INPUT", "1", "-j", ChainProxyPortGuard},
		{"-t", "filter", "-A", "INPUT", "-p", "tcp", "-j", "ACCEPT"},
	} {
		inNetns(t, ns, append([]string{other}, args...)...)
	}
	th := startNSThread(t, ns)
	th.do(func() { err = CleanupAll() })
	if err != nil {
		t.Fatalf("CleanupAll: %v", err)
	}
	dump := inNetns(t, ns, other+"-save")
	if strings.Contains(dump, "KUBE-") || strings.Contains(dump, "kube-userspace-proxy") {
		t.Errorf("%s-save after --cleanup still shows our rules:\n%s", other, dump)
	}
	if !strings.Contains(dump, "-A INPUT -p tcp -j ACCEPT") {
		t.Errorf("%s-save after --cleanup lost a foreign rule:\n%s", other, dump)
	}
}
