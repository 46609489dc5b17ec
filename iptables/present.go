package iptables

import (
	"fmt"
	"strings"
)

// Present reports why r's family cannot hold our rules on this node, or nil
// when it can. The binaries can be installed while the kernel has no table
// for the family (no ip6table_nat, IPv6 disabled at boot): such a family
// failed every sync, so /healthz never turned ready, and failed --cleanup.
// As kube-proxy's Present, a built-in chain must answer (iptables -t nat -S
// POSTROUTING 1): in nat, and in filter, which the port guard needs too.
// Called at start, as kube-proxy's probe. A failure is not always an
// absence: the caller retries one that IsLockHeld, as it passes.
func Present(r Runner) error {
	for _, c := range []ownedChain{{TableNAT, "POSTROUTING"}, {TableFilter, "INPUT"}} {
		ok, err := r.ChainExists(c.table, c.name)
		if err == nil && !ok && printedIncompatible(r, c.table) {
			// iptables-nft cannot list a chain holding a rule only nft
			// decodes (a masquerade written with nft in POSTROUTING) and
			// says so with exit status 1, which reads as no such chain;
			// but the table is there, and holds our chains as any other
			// (see unprintable): the start refused such a node.
			ok = true
		}
		if err == nil && !ok {
			err = fmt.Errorf("no built-in chain %s", c.name)
		}
		if err != nil {
			return fmt.Errorf("%v %s table: %w", r.Family(), c.table, err)
		}
	}
	return nil
}

// IsLockHeld reports whether err is iptables giving up on the xtables lock
// another process holds (iptables-legacy, exit status 4: "Another app is
// currently holding the xtables lock"): the binaries and tables may be
// fine, and the next try may get through.
func IsLockHeld(err error) bool {
	return err != nil && strings.Contains(err.Error(), "holding the xtables lock")
}

// printedIncompatible reports whether iptables-save prints table as one it
// cannot decode ("# Table `nat' is incompatible, use 'nft' tool."): a table
// the kernel has.
func printedIncompatible(r Runner, table Table) bool {
	data, err := r.Save(table)
	if err != nil {
		return false
	}
	_, ok := unprintable(data, table)
	return ok
}
