package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"k8s.io/klog/v2"
)

// routeIPsInterval is how often routeIPsWatch looks at the node's
// addresses (a variable: tests shorten it).
var routeIPsInterval = 5 * time.Second

// routeIPsWatch looks after the node IPs taken from the default route (no
// --node-ip, --bind-address or Node address decided the family): the
// portals DNAT to them, so when one is no longer an address of the node
// (a DHCP lease renumbered, a VIP moved away) every Service's traffic of
// that family is lost, silently, while /healthz says 200. Gone in two
// looks in a row while the default route now has another source, it
// restarts the proxy (as a Node whose addresses moved does, nodeIPsWatch)
// so that the portals take the new one; gone with nothing to take instead
// (the link down), it is logged once and waited for.
type routeIPsWatch struct {
	inUse   [2]netip.Addr // by family (0: IPv4, 1: IPv6); invalid: not watched
	routes  [2]func() netip.Addr
	isLocal func(netip.Addr) bool
	restart func(error)
	gone    [2]int  // looks in a row that found inUse gone
	told    [2]bool // the loss was logged
}

// newRouteIPsWatch watches the families whose node IP hostIPOf took from
// the default route.
func newRouteIPsWatch(v *validated, isLocal func(netip.Addr) bool, restart func(error)) *routeIPsWatch {
	w := &routeIPsWatch{inUse: hostIPsInUse(v), routes: [2]func() netip.Addr{defaultRoutes.v4, defaultRoutes.v6}, isLocal: isLocal, restart: restart}
	for _, ip := range v.nodeObjectIPs {
		w.inUse[familyIndex(ip)] = netip.Addr{} // the Node's: nodeIPsWatch looks after it
	}
	return w
}

// run looks every interval until ctx ends or it has asked for a restart.
func (w *routeIPsWatch) run(ctx context.Context, interval time.Duration) {
	if !w.inUse[0].IsValid() && !w.inUse[1].IsValid() {
		return
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if w.look() {
				return
			}
		}
	}
}

// look checks each watched node IP once; true: a restart was asked for.
func (w *routeIPsWatch) look() bool {
	for i, ip := range w.inUse {
		if !ip.IsValid() {
			continue
		}
		if w.isLocal(ip) {
			if w.told[i] {
				klog.InfoS("The node IP is an address of this node again; portal traffic reaches the proxy", "nodeIP", ip)
			}
			w.gone[i], w.told[i] = 0, false
			continue
		}
		if w.gone[i]++; w.gone[i] < 2 {
			continue // a moment's absence (a renewal) is not a move
		}
		now := w.routes[i]()
		if now.IsValid() && now != ip && w.restart != nil {
			klog.InfoS("The node IP the portals DNAT to is no longer an address of this node, and the default route's is another; restarting so that the portals take it (rules and proxy ports are kept)", "nodeIP", ip, "newNodeIP", now)
			w.restart(fmt.Errorf("node IP %v is no longer an address of this node (the default route's is %v): restart to take it", ip, now))
			return true
		}
		if !w.told[i] {
			w.told[i] = true
			klog.ErrorS(nil, "The node IP the portals DNAT to is no longer an address of this node: the node's Service traffic of its family is lost until it returns (or give --node-ip)", "nodeIP", ip, "defaultRouteNow", now)
		}
	}
	return false
}
