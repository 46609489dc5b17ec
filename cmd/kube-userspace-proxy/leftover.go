package main

import (
	"maps"
	"slices"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// warnLeftoverPortals says, for --iptables=false, which portal chains an
// earlier run left in each family: they send this proxy's Services to
// proxy ports nothing listens on, so every Service was refused while
// /healthz answered 200 and nothing was logged. A family without iptables,
// or one that cannot be read, says nothing: the flag means rules are not
// ours to touch, and only reading them is tried. It returns what it logged.
func warnLeftoverPortals(newRunner func(iptables.Family) (iptables.Runner, error)) []string {
	var said []string
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		r, err := newRunner(f)
		if err != nil {
			continue
		}
		left, err := iptables.LeftoverPortals(r)
		if err != nil || len(left) == 0 {
			continue
		}
		chains := slices.Sorted(maps.Keys(left))
		klog.InfoS("Warning: --iptables=false, but portal rules of an earlier run are in place; they send Services' traffic to proxy ports nothing here listens on, so it is refused: "+
			"remove them with --cleanup, or run with rules", "ipFamily", f, "chains", chains)
		said = append(said, f.String())
	}
	return said
}
