package main

import (
	"context"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// nodeLookupTimeout bounds the read of this node's Node object at start: a
// proxy restarted while the API server is away goes on with the
// default-route address and serves from its state file, rather than wait.
const nodeLookupTimeout = 3 * time.Second

// readNodeObjectIPs sets v.nodeObjectIPs from this node's Node object, as
// kube-proxy takes its node IPs from it before it programs anything: they
// are the portals' DNAT target and the addresses of --nodeport-addresses
// primary for each family --node-ip and --bind-address leave open, where
// the default-route interface's address was (wrong on a node whose
// InternalIP is on another interface). Without a Node, or without the API
// server within nodeLookupTimeout, the default route stays.
func readNodeObjectIPs(ctx context.Context, o *options, v *validated, isLocal func(netip.Addr) bool) {
	name := nodeName(o.hostnameOverride)
	client, err := apiClient(o)
	if err != nil {
		return // newSource says it
	}
	ctx, cancel := context.WithTimeout(ctx, nodeLookupTimeout)
	defer cancel()
	node, err := config.ReadNode(ctx, client, name)
	if err != nil {
		klog.InfoS("Could not read this node's Node object; node IPs come from the default-route interfaces", "node", name, "err", err)
		return
	}
	var notLocal []netip.Addr
	v.nodeObjectIPs, notLocal = nodeObjectIPs(node, isLocal)
	if len(notLocal) > 0 {
		klog.InfoS("Warning: the Node object names addresses no interface of this node holds; they are not used as node IPs", "node", name, "addresses", notLocal)
	}
	if len(v.nodeObjectIPs) > 0 {
		klog.InfoS("Successfully retrieved NodeIPs", "node", name, "NodeIPs", v.nodeObjectIPs)
	}
}

// nodeObjectIPs is the first address of each family among a Node's
// InternalIPs, then its ExternalIPs (kube-proxy's GetNodeHostIPs), that an
// interface here holds: a DNAT to any other would send the node's own
// Service traffic away from its proxy sockets. notLocal are those passed
// over.
func nodeObjectIPs(node config.NodeInfo, isLocal func(netip.Addr) bool) (ips, notLocal []netip.Addr) {
	var have4, have6 bool
	for _, ip := range node.Addresses {
		have := &have4
		if !ip.Is4() {
			have = &have6
		}
		switch {
		case *have:
		case !isLocal(ip):
			notLocal = append(notLocal, ip)
		default:
			*have = true
			ips = append(ips, ip)
		}
	}
	return ips, notLocal
}

// hostIPOf is one family's node IP when no flag names one: the Node
// object's (readNodeObjectIPs), else the default-route interface's.
func hostIPOf(v *validated, six bool, fromRoute func() netip.Addr) netip.Addr {
	for _, ip := range v.nodeObjectIPs {
		if ip.Is4() != six {
			return ip
		}
	}
	return fromRoute()
}

// nodeIPsChanged says, once, that the Node object's addresses moved since
// start. The rules keep the start's node IPs until a restart (kube-proxy
// exits here and is restarted by its DaemonSet; this proxy keeps serving).
type nodeIPsChanged struct {
	start   []netip.Addr
	isLocal func(netip.Addr) bool
	said    atomic.Bool
}

func (c *nodeIPsChanged) check(node config.NodeInfo) {
	if c == nil || c.said.Load() || node.Deleted {
		return
	}
	now, _ := nodeObjectIPs(node, c.isLocal)
	if slices.Equal(now, c.start) || !c.said.CompareAndSwap(false, true) {
		return
	}
	klog.InfoS("NodeIPs changed for the node; the portals keep the node IPs read at start until the proxy restarts", "node", node.Name, "newNodeIPs", now, "oldNodeIPs", c.start)
}
