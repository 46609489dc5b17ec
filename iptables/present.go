package iptables

import "fmt"

// Present reports why r's family cannot hold our rules on this node, or nil
// when it can. The binaries can be installed while the kernel has no table
// for the family (no ip6table_nat, IPv6 disabled at boot): such a family
// failed every sync, so /healthz never turned ready, and failed --cleanup.
// As kube-proxy's Present, a built-in chain must answer (iptables -t nat -S
// POSTROUTING 1): in nat, and in filter, which the port guard needs too.
// Called once, at start, as kube-proxy's probe; any failure counts, as
// there, so a lock held past the wait then leaves the family off until a
// restart (the caller logs why).
func Present(r Runner) error {
	for _, c := range []ownedChain{{TableNAT, "POSTROUTING"}, {TableFilter, "INPUT"}} {
		ok, err := r.ChainExists(c.table, c.name)
		if err == nil && !ok {
			err = fmt.Errorf("no built-in chain %s", c.name)
		}
		if err != nil {
			return fmt.Errorf("%v %s table: %w", r.Family(), c.table, err)
		}
	}
	return nil
}
