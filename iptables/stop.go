package iptables

import (
	"fmt"
	"strings"

	"k8s.io/klog/v2"
)

// acceptChains are the chains that accept portal traffic into INPUT, which
// Stop flushes.
var acceptChains = []string{ChainNodePortNonLocal, ChainPortalsNonLocal}

// Stop flushes the accepts of portal traffic (KUBE-NODEPORT-NON-LOCAL and
// KUBE-PORTALS-NON-LOCAL), for a proxy about to close its sockets: the
// portals stay (a restart keeps its ports and rewrites none), but until a
// successor's first sync writes the accepts back, what they send to a
// proxy port meets KUBE-PROXY-PORT-REJECT and is refused, as by a port
// where nothing listens, even when a local user has bound the port
// meanwhile. One restore; flushing a parent chain leaves its buckets
// unreferenced, and the next Sync refills or deletes them. Chains of ours
// this process has not seen are looked up first, so a node without them
// gets none. A proxy killed without Stop leaves the accepts in place.
func (r *Rules) Stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	known := r.have
	r.have, r.lastRead = nil, nil // the next call reads the kernel again
	var flush []string
	if known != nil {
		flush = acceptChains
	} else {
		saved, err := r.readBack()
		if err != nil {
			return err
		}
		for _, c := range acceptChains {
			has, err := r.chainIn(saved, TableFilter, c)
			if err != nil {
				return err
			}
			if has {
				flush = append(flush, c)
			}
		}
	}
	if len(flush) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("*filter\n")
	for _, c := range flush {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	b.WriteString("COMMIT\n")
	if err := r.runner.Restore([]byte(b.String())); err != nil {
		return fmt.Errorf("%v: flushing the accepts of portal traffic: %w", r.cfg.Family, err)
	}
	klog.V(2).InfoS("Flushed the accepts of portal traffic; it is rejected until the next sync", "family", r.cfg.Family, "chains", flush)
	return nil
}
