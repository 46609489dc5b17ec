package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// portalSyncers builds one rule syncer per IP family the node can program,
// each on the runner newRunner returns (iptables.NewRunner; tests pass
// fakes). Each family is probed here, as kube-proxy does at start
// (iptables.Present). IPv6 is optional: a node without ip6tables, or whose
// kernel has no IPv6 nat table, serves IPv4 only; it is said once here,
// where a syncer for it failed every sync and kept /healthz unready. An
// xtables lock another process holds says nothing of either (probeFamily).
func portalSyncers(ctx context.Context, v *validated, newRunner func(iptables.Family) (iptables.Runner, error)) (proxier.PortalSyncer, proxier.PortalSyncer, error) {
	cfg, cfg6, nodeIPs := portalConfigs(v)
	v.portalNodeIPs, v.portalNodeIPsSet = [2]netip.Addr{cfg.NodeIP, cfg6.NodeIP}, true
	// One wait for both families: two full waits outlived the liveness
	// probe.
	deadline := time.Now().Add(lockWait)
	r4, waited, err := probeFamily(ctx, iptables.IPv4, newRunner, deadline)
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	if iptables.IsLockHeld(err) {
		// Not a node without iptables, nor a lack of privileges: another
		// process (a CNI, a firewall) keeps the lock; a restart retries.
		return nil, nil, fmt.Errorf("iptables: the xtables lock is held by another process (waited %v for it): %s", waited.Round(time.Second), strings.TrimSpace(err.Error()))
	}
	if errors.Is(err, exec.ErrNotFound) {
		// A binary missing from PATH (privileges were checked before
		// this, with their own message): the error names it, and was
		// prefixed "iptables: " a second time and blamed on root.
		return nil, nil, fmt.Errorf("%w: install iptables (Debian/Ubuntu: apt-get install iptables; iptables, iptables-save and iptables-restore are run), or use --iptables=false for sockets only", err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("iptables: %w (run as root with iptables installed, or use --iptables=false)", err)
	}
	var v4, v6 proxier.PortalSyncer
	iptables.WarnOtherBackend(r4)
	v4 = iptables.New(r4, cfg)
	r6, waited, err := probeFamily(ctx, iptables.IPv6, newRunner, deadline)
	if ctx.Err() != nil {
		// Stopped during the wait: nothing more to set up (no IPv6 verdict
		// to log, no other family's rules to clean under a held lock).
		return nil, nil, ctx.Err()
	}
	r6Locked := iptables.IsLockHeld(err) && r6 != nil
	if r6Locked {
		// ip6tables runs: only the lock kept it from answering. Taken as
		// absent, IPv6 stayed off until a restart, its Services refused
		// and the last run's portals sending them to closed ports.
		klog.InfoS("The xtables lock is still held by another process: IPv6 is served and its syncs retry until the lock frees", "waited", waited.Round(time.Second), "reason", err)
		err = nil
	}
	if err != nil {
		klog.InfoS("No iptables support for family: its Services get no portals", "ipFamily", "IPv6", "reason", err)
		r6 = nil
	} else {
		iptables.WarnOtherBackend(r6)
		v6 = iptables.New(r6, cfg6)
	}
	if family, ok := bindFamily(v); ok {
		// Proxy sockets on one address of one family cannot take the other
		// family's traffic: portals of that family led to refused
		// connections (and REDIRECTed to a port nothing listened on).
		// Served as on a node without that family's netfilter.
		other, otherRunner := "IPv6", r6
		if family == iptables.IPv6 {
			other, otherRunner, v4 = "IPv4", r4, nil
		} else {
			v6 = nil
		}
		klog.InfoS("--bind-address names one address: the other family's Services get no portals (dual-stack ones are served in its family)",
			"bindAddress", v.bind, "ipFamily", other)
		if otherRunner != nil {
			// A proxy that ran here before with both families left that
			// family's portals, which no syncer of this one repairs: they
			// sent its clients to proxy ports nothing of ours listens on
			// (another process's, once).
			cleanup := func() {
				if err := iptables.Cleanup(otherRunner); err != nil {
					klog.ErrorS(err, "Removing the rules a previous run left in the family --bind-address does not serve", "ipFamily", other)
				}
			}
			if family == iptables.IPv4 && r6Locked {
				// In the background: under the held lock Cleanup asks
				// again for about a minute, which held start-up (and
				// /livez) past the liveness probe; no syncer of ours
				// touches that family.
				go cleanup()
			} else {
				cleanup()
			}
		}
	}
	logNodeIPs(v, nodeIPs, v4 != nil, v6 != nil)
	return v4, v6, nil
}

// logNodeIPs says at start which node IP each served family's portals
// DNAT to (served4, served6: the families with rules), and what is odd
// about them: a --node-ip the node does not hold, a family without one,
// a link-local one.
func logNodeIPs(v *validated, nodeIPs []netip.Addr, served4, served6 bool) {
	if v.nodeIP.IsValid() && !isLocalAddress(v.nodeIP) {
		klog.InfoS("Warning: --node-ip is not an address of this node's interfaces: portal traffic DNATed to it leaves the node instead of reaching the proxy", "nodeIP", v.nodeIP)
	}
	// Each family's with rules: the IPv6 portals DNAT to the IPv6 one
	// (one address was named, whichever family it was).
	nodeIPs = slices.DeleteFunc(nodeIPs, func(ip netip.Addr) bool { return ip.Is4() && !served4 || ip.Is6() && !served6 })
	// A family with rules but no node IP (no default route, no --node-ip,
	// no Node address) has portals that REDIRECT (to the address a packet
	// arrived on), or DNAT to --bind-address when it names one, instead of
	// DNAT to a node IP. Said per family: a dual-stack node missing one
	// family's said nothing of it.
	var without []string
	for _, f := range []struct {
		name   string
		served bool
		six    bool
	}{{"IPv4", served4, false}, {"IPv6", served6, true}} {
		if f.served && !slices.ContainsFunc(nodeIPs, func(ip netip.Addr) bool { return ip.Is6() == f.six }) {
			without = append(without, f.name)
		}
	}
	// Without a default route the node's own connections to a ClusterIP
	// fail (network unreachable) before the OUTPUT portal sees them: the
	// kernel routes a local connection first. A namespace with lo only
	// (a learner's node) served NodePorts and said nothing of why its
	// ClusterIPs failed. There a route needs a source too: "dev lo"
	// alone gave the client 0.0.0.0, and curl timed out.
	needRoute := func(whose string) string {
		return "; the node's own connections to " + whose + " need a route to them (a default route, or one covering the service range; " +
			"with lo only, one with a source: ip route add 10.96.0.0/12 dev lo src 127.0.0.1), or fail as network unreachable before any portal sees them"
	}
	switch {
	case len(without) == 0:
		klog.InfoS("Portal rules enabled", "nodeIPs", nodeIPs)
	case len(nodeIPs) == 0:
		klog.InfoS("Portal rules enabled; no node IP (no default route, no --node-ip): portals REDIRECT, or DNAT to --bind-address when it names an address" + needRoute("ClusterIPs"))
	default:
		klog.InfoS("Portal rules enabled; some families have no node IP (no default route, no --node-ip): their portals REDIRECT, or DNAT to --bind-address when it names an address"+needRoute("their ClusterIPs"), "nodeIPs", nodeIPs, "withoutNodeIP", without)
	}
	if i := slices.IndexFunc(nodeIPs, iptables.LinkScoped); i >= 0 && (!v.bind.IsValid() || v.bind.IsUnspecified()) {
		// Local on its own link only: other links' traffic DNATed to it
		// would be routed out again (iptables.Rules.containerTarget,
		// hostTarget).
		klog.InfoS("The IPv6 node IP is link-local: traffic from pods and other hosts is REDIRECTed to the address it arrived on, the node's own to the loopback address", "nodeIP", nodeIPs[i])
	}
}

// lockWait bounds how long start-up waits out an xtables lock another
// process holds, trying again every lockRetryInterval (each try itself
// waits 5 s for the lock, iptables -w 5): about 25 s at most per family,
// within the shipped DaemonSet's liveness probe (which kills the
// container at about 40 s: /livez is served only after this), so the
// clear error below is what the log shows, not a kill. 60 s never got
// that far.
var lockWait, lockRetryInterval = 20 * time.Second, 2 * time.Second

// probeFamily returns f's runner and whether the family can hold our
// rules (iptables.Present), trying again while the xtables lock is held
// by another process, for up to lockWait: a lock held at the wrong moment
// is no answer about the family.
// It also returns how long it waited. It waits no longer than deadline.
func probeFamily(ctx context.Context, f iptables.Family, newRunner func(iptables.Family) (iptables.Runner, error), deadline time.Time) (iptables.Runner, time.Duration, error) {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		r, err := newRunner(f)
		if err == nil {
			err = iptables.Present(r)
		}
		if !iptables.IsLockHeld(err) || !time.Now().Before(deadline) {
			return r, time.Since(start), err
		}
		klog.InfoS("The xtables lock is held by another process: waiting for it to probe the family's iptables", "ipFamily", f, "attempt", attempt, "waited", time.Since(start).Round(time.Second), "giveUpAfter", lockWait)
		select {
		case <-ctx.Done():
			return r, time.Since(start), err
		case <-time.After(lockRetryInterval):
		}
	}
}

// kube-proxy's --nodeport-addresses keywords: the node's primary IPs, the
// loopback CIDRs and every address.
const (
	nodePortAddressesPrimary   = "primary"
	nodePortAddressesLocalhost = "localhost"
	nodePortAddressesAll       = "all"
)

// nodePortKeywordCIDRs are the CIDRs of localhost and all, as kube-proxy's
// expandNodePortAddressKeywords writes them.
var nodePortKeywordCIDRs = map[string][]netip.Prefix{
	nodePortAddressesLocalhost: {netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
	nodePortAddressesAll:       {netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
}

// resolveNodePortAddresses adds for --nodeport-addresses primary each
// family's primary node IP as a single-address CIDR to the list's other
// CIDRs, as kube-proxy does at start (expandNodePortAddressKeywords), for
// the NodePort portals and the healthCheckNodePort servers alike. The
// primary IP is --node-ip, else the default-route address: not
// --bind-address, which is where proxy sockets listen. It was the bind
// address, so a loopback one (the README's first run) left NodePorts on
// every address, and an IPv4 one left IPv6 unrestricted. A family with
// neither is skipped, as kube-proxy skips a family whose node IP it could
// not find (loopback): a family without CIDRs of its own is not limited,
// there as here.
//
// A family with a /0 (all, 0.0.0.0/0, ::/0) takes every address: its
// CIDRs are dropped, which says the same (a family without CIDRs is not
// limited) in rules iptables-save prints back as written (it prints no
// "-d 0.0.0.0/0", so each start's first periodic sync "repaired" them).
func resolveNodePortAddresses(v *validated) {
	primary := v.nodePortPrimary
	v.nodePortPrimary = false
	if primary {
		for _, f := range []struct {
			six   bool
			route func() netip.Addr
		}{{false, defaultRoutes.v4}, {true, defaultRoutes.v6}} {
			ip := v.nodeIP
			if !ip.IsValid() || ip.Is4() == f.six {
				ip = hostIPOf(v, f.six, f.route)
			}
			if ip.IsValid() && !ip.IsLoopback() {
				v.nodePortAddresses = append(v.nodePortAddresses, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	everyAddress := map[bool]bool{}
	for _, p := range v.nodePortAddresses {
		if p.Bits() == 0 {
			everyAddress[p.Addr().Is4()] = true
		}
	}
	v.nodePortAddresses = slices.DeleteFunc(v.nodePortAddresses, func(p netip.Prefix) bool { return everyAddress[p.Addr().Is4()] })
	if !primary {
		return
	}
	var unrestricted []string
	for _, f := range []struct {
		name string
		four bool
	}{{"IPv4", true}, {"IPv6", false}} {
		if !slices.ContainsFunc(v.nodePortAddresses, func(p netip.Prefix) bool { return p.Addr().Is4() == f.four }) {
			unrestricted = append(unrestricted, f.name)
		}
	}
	if len(unrestricted) > 0 {
		klog.InfoS("NodePorts answer on the node's primary IPs and the other --nodeport-addresses; a family without any (no --node-ip, no default route, or a /0) is not restricted, as in kube-proxy",
			"addresses", v.nodePortAddresses, "unrestricted", unrestricted)
	} else {
		klog.InfoS("NodePorts answer on the node's primary IPs and the other --nodeport-addresses", "addresses", v.nodePortAddresses)
	}
}

// bindFamily is the family of a --bind-address that names one address,
// false for 0.0.0.0 and ::, which take both families.
func bindFamily(v *validated) (iptables.Family, bool) {
	if !v.bind.IsValid() || v.bind.IsUnspecified() {
		return 0, false
	}
	if v.bind.Unmap().Is4() {
		return iptables.IPv4, true
	}
	return iptables.IPv6, true
}

// portalConfigs is how the flags shape each family's rules (the proxy and
// explain alike): where proxy sockets listen, the node IP of each family
// that traffic is DNATed to (nodeIPOf), and --nodeport-addresses. nodeIP
// is the one to report: --node-ip, else the IPv4 one, else the IPv6 one.
func portalConfigs(v *validated) (cfg4, cfg6 iptables.Config, nodeIPs []netip.Addr) {
	cfg4 = iptables.Config{Family: iptables.IPv4, NodePortAddresses: v.nodePortAddresses, PreroutingRedirect: v.preroutingRedirect, ClusterCIDRs: v.clusterCIDRs}
	if v.bind.Is4() {
		cfg4.BindAddress = v.bind
	}
	cfg4.NodeIP = nodeIPOf(v, false, defaultRoutes.v4)
	cfg6 = iptables.Config{Family: iptables.IPv6, NodePortAddresses: v.nodePortAddresses, PreroutingRedirect: v.preroutingRedirect, ClusterCIDRs: v.clusterCIDRs}
	if v.bind.Is6() {
		cfg6.BindAddress = v.bind
	}
	cfg6.NodeIP = nodeIPOf(v, true, defaultRoutes.v6)
	for _, ip := range []netip.Addr{cfg4.NodeIP, cfg6.NodeIP} {
		if ip.IsValid() {
			nodeIPs = append(nodeIPs, ip)
		}
	}
	return cfg4, cfg6, nodeIPs
}

// nodeIPOf is one family's node IP: --node-ip when it is of that family,
// else a specific --bind-address of that family, else (neither flag names
// an address of the family) the address of that family's default-route
// interface. An IPv6 --node-ip used to leave IPv4 without a node IP, and
// IPv6 never had one: its portals fell back to REDIRECT.
func nodeIPOf(v *validated, six bool, fromRoute func() netip.Addr) netip.Addr {
	ofFamily := func(a netip.Addr) bool { return a.IsValid() && !a.IsUnspecified() && a.Unmap().Is4() != six }
	switch {
	case ofFamily(v.nodeIP):
		return v.nodeIP.Unmap()
	case ofFamily(v.bind):
		return v.bind.Unmap()
	case v.bind.IsValid() && !v.bind.IsUnspecified():
		return netip.Addr{} // sockets listen on one address of the other family
	}
	return hostIPOf(v, six, fromRoute)
}
