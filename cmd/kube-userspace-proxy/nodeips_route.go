package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
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
// (the link down), it is logged once and waited for. IPv4, when the
// default route decides it and had none at start (its portals REDIRECT: a
// DHCP lease late at boot, a start during a link flap), restarts the proxy
// likewise once a default route is seen in two looks: IPv4 REDIRECT loses
// pods on veths without an address (Calico, the AWS VPC CNI), and kept
// doing so until some other restart. IPv6 is left on REDIRECT: every IPv6
// interface has a link-local address, which REDIRECT takes (lab: such a
// pod served either way), so a restart there would only cut connections.
type routeIPsWatch struct {
	inUse   [2]netip.Addr // by family (0: IPv4, 1: IPv6); invalid: not watched
	routes  [2]func() netip.Addr
	isLocal func(netip.Addr) bool
	restart func(error)
	gone    [2]int  // looks in a row that found inUse gone
	told    [2]bool // the loss was logged
	// ipv4Unfound: the default route decides IPv4 and had no address at
	// start; ipv4Found counts the looks in a row that found one since.
	ipv4Unfound bool
	ipv4Found   int
}

// newRouteIPsWatch watches the families whose node IP hostIPOf took from
// the default route.
func newRouteIPsWatch(v *validated, isLocal func(netip.Addr) bool, restart func(error)) *routeIPsWatch {
	w := &routeIPsWatch{inUse: hostIPsInUse(v), routes: [2]func() netip.Addr{defaultRoutes.v4, defaultRoutes.v6}, isLocal: isLocal, restart: restart}
	for _, ip := range v.nodeObjectIPs {
		w.inUse[familyIndex(ip)] = netip.Addr{} // the Node's: nodeIPsWatch looks after it
	}
	// With --prerouting-redirect the portals REDIRECT pods' traffic
	// whatever the node IP: a restart would only cut connections.
	w.ipv4Unfound = routeDecidesIPv4(v) && !v.preroutingRedirect && !w.inUse[0].IsValid()
	return w
}

// routeDecidesIPv4 is whether the IPv4 node IP is the default route's: no
// --bind-address naming an address, no IPv4 --node-ip, no IPv4 address on
// the Node (hostIPsInUse's rule).
func routeDecidesIPv4(v *validated) bool {
	if v.bind.IsValid() && !v.bind.IsUnspecified() || v.nodeIP.IsValid() && familyIndex(v.nodeIP) == 0 {
		return false
	}
	return !slices.ContainsFunc(v.nodeObjectIPs, func(ip netip.Addr) bool { return familyIndex(ip) == 0 })
}

// run looks every interval until ctx ends or it has asked for a restart.
func (w *routeIPsWatch) run(ctx context.Context, interval time.Duration) {
	if !w.inUse[0].IsValid() && !w.inUse[1].IsValid() && !w.ipv4Unfound {
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
	if w.ipv4Unfound {
		if now := w.routes[0](); !now.IsValid() {
			w.ipv4Found = 0
		} else if w.ipv4Found++; w.ipv4Found >= 2 && w.restart != nil {
			klog.InfoS("The default route now has an IPv4 address, and the IPv4 portals had no node IP (they REDIRECT); restarting so that they DNAT to it (rules and proxy ports are kept)", "newNodeIP", now)
			w.restart(fmt.Errorf("the default route's %v is an IPv4 node IP, where there was none: restart to take it", now))
			return true
		}
	}
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
