package demo

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
)

// nsMetricsAddr is the proxy's metrics address inside the node namespace,
// which is new and empty, so a fixed port cannot be taken.
const nsMetricsAddr = "127.0.0.1:10249"

// allClients are every client the experiments use, so that the client
// namespace holds their addresses.
func allClients() []client {
	cs := []client{cli1, cli2, refreshClient}
	for i := range trialCount {
		cs = append(cs, shortClient(i), longClient(i))
	}
	return cs
}

// CleanupError is RunNetNS's failure to remove the namespaces it made:
// they are left on the machine, and the message says how to remove them.
// Err is what ended the run before (nil: nothing did); a caller that says
// an interruption its own way (Ctrl-C) still has to say this part.
type CleanupError struct{ Err, Cleanup error }

func (e *CleanupError) Error() string {
	if e.Err == nil {
		return e.CleanupMessage()
	}
	return fmt.Sprintf("%v; %s", e.Err, e.CleanupMessage())
}

// CleanupMessage is the part of the error about the namespaces left.
func (e *CleanupError) CleanupMessage() string {
	return fmt.Sprintf("removing the namespaces: %v (remove them with: ip netns del NAME)", e.Cleanup)
}

func (e *CleanupError) Unwrap() error { return e.Err }

// RunNetNS runs the demonstration as Run does, but through real iptables
// portals: the proxy runs as a process (c) with iptables in a throw-away
// node namespace, the backends have pod addresses there, and the clients
// connect from a second namespace to the Services' ClusterIPs. After the
// experiments it prints the rules the proxy installed and the conntrack
// entries the traffic left. Everything is removed before it returns, also
// when ctx ends early (Ctrl-C) or a step fails. Needs root.
func RunNetNS(ctx context.Context, out io.Writer, opt Options, c Command) (matched bool, err error) {
	if opt.Width <= 0 {
		opt.Width = DefaultWidth
	}
	if os.Geteuid() != 0 {
		return false, errNotRoot
	}
	for _, tool := range []string{"ip", "iptables-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			return false, fmt.Errorf("demo --netns needs %s (Debian: apt-get install iproute2 iptables)", tool)
		}
	}
	nw, err := newNetwork(allClients())
	if err != nil {
		return false, fmt.Errorf("setting up the namespaces: %w", err)
	}
	names := nw.node.name + " and " + nw.client.name
	defer func() {
		if rerr := nw.remove(); rerr != nil {
			err = &CleanupError{Err: err, Cleanup: rerr}
			return
		}
		fmt.Fprintln(out)
		paragraph(out, opt.Width, fmt.Sprintf("Cleaned up: the proxy stopped, the namespaces %s deleted, and with them every address, rule and conntrack entry of the run.", names))
	}()

	backends, err := startBackendsAt(func(i int) string { return demoPodIPs[i] }, nw.node.do, "backend-a", "backend-b", "backend-c")
	if err != nil {
		return false, err
	}
	defer stopBackends(backends)
	m, err := newManifestDir(backends)
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(m.dir)
	dir := m.dir

	args := []string{"--manifests", dir, "--node-ip", nodeIP().String(),
		"--metrics-bind-address", nsMetricsAddr, "--healthz-bind-address", ""}
	px, err := startProxyProcess(nw.node, c, args)
	if err != nil {
		return false, err
	}
	defer px.stop()
	view := newHTTPView(nw.node, nsMetricsAddr)
	defer view.close()

	l := &lab{p: view, cn: nsClients{nw.client}, backends: backends, manifests: m,
		viaClusterIP: true, socketHost: nodeIP(), clientWhere: "client namespace"}
	portal := func(to netip.AddrPort) string { return portalRule(nw.node, to) }
	web := netip.MustParseAddrPort("10.96.0.10:80")
	if err := px.waitUp(ctx, func() bool { return l.ready() && portal(web) != "" }); err != nil {
		return false, err
	}
	paragraph(out, opt.Width, fmt.Sprintf("Namespaces of this run: %s (the node: proxy, rules, backends) and %s (the clients). They are deleted at the end, also on Ctrl-C.", nw.node.name, nw.client.name))
	fmt.Fprintln(out)
	l.intro(out, opt.Width, args, setting{
		headline: "through real iptables rules in two throw-away network namespaces",
		backends: " at pod addresses in the node namespace",
		proxy:    "as a process with iptables in the node namespace (node IP " + nodeIP().String() + ")",
		clients:  " in the client namespace, and connect to the ClusterIPs",
	})
	matched, err = l.run(ctx, out, opt.Width, portal)
	if err != nil {
		return false, err
	}
	printRules(out, nw.node)
	printConntrack(out, opt.Width, nw.node, l)
	return matched, nil
}

// iptablesSave is one table of the node's rules, as iptables-save prints it.
func iptablesSave(ns netNS, table string) []string {
	out, err := ns.exec("iptables-save", "-t", table)
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// portalRule is the PREROUTING portal for a ClusterIP and port, "" until
// the proxy has installed it.
func portalRule(ns netNS, to netip.AddrPort) string {
	dst := "-d " + to.Addr().String() + "/32 "
	dport := fmt.Sprintf("--dport %d ", to.Port())
	for _, line := range iptablesSave(ns, "nat") {
		if strings.HasPrefix(line, "-A KUBE-PORTALS-CONTAINER ") && strings.Contains(line, dst) && strings.Contains(line+" ", dport) {
			return line
		}
	}
	return ""
}

// ourRules keeps the lines of a table that are this proxy's: its chains,
// their rules and the jumps into them from the built-in chains.
func ourRules(lines []string) []string {
	var out []string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, ":KUBE-"):
			if i := strings.LastIndex(l, " ["); i > 0 {
				l = l[:i] // packet counters change on every read
			}
			out = append(out, l)
		case strings.HasPrefix(l, "-A KUBE-"), strings.HasPrefix(l, "-A ") && strings.Contains(l, " -j KUBE-"):
			out = append(out, l)
		}
	}
	return out
}

func printRules(out io.Writer, ns netNS) {
	fmt.Fprintln(out, "\nThe rules the proxy installed in the node namespace (iptables-save, its chains only):")
	for _, table := range []string{"nat", "filter"} {
		fmt.Fprintf(out, "\n*%s\n", table)
		for _, l := range ourRules(iptablesSave(ns, table)) {
			fmt.Fprintln(out, l)
		}
	}
	fmt.Fprintln(out, `
The KUBE-PORTALS-CONTAINER rules (from PREROUTING) catch the clients' packets to
a ClusterIP and port and DNAT them to the proxy socket on the node IP;
KUBE-PORTALS-HOST does the same for the node's own connections (from OUTPUT).
KUBE-PROXY-PORT-GUARD drops new connections that reach a proxy port without
passing a portal.`)
}
