package iptables

import "fmt"

// LeftoverPortals returns, per nat chain of ours that holds rules, how
// many it holds: portals an earlier run left (a stop leaves nat as it is,
// so that a restart rewrites nothing). A proxy run with --iptables=false
// writes no rule, and such portals send its Services' traffic to proxy
// ports nothing listens on: refused, while /healthz says 200.
func LeftoverPortals(r Runner) (map[string]int, error) {
	data, err := r.Save(TableNAT)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", r.Family(), err)
	}
	saved, err := parseSave(data, TableNAT)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", r.Family(), err)
	}
	out := map[string]int{}
	for _, c := range ownedChains {
		if n := len(saved.rules[c.name]); c.table == TableNAT && n > 0 {
			out[c.name] = n
		}
	}
	return out, nil
}
