package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// nodeLookupTimeout bounds the read of this node's Node object at start: a
// proxy restarted while the API server is away goes on with the
// default-route address and serves from its state file, rather than wait.
const nodeLookupTimeout = 2 * time.Second

// readNodeObjectIPs sets v.nodeObjectIPs from this node's Node object, as
// kube-proxy takes its node IPs from it before it programs anything: they
// are the portals' DNAT target and the addresses of --nodeport-addresses
// primary for each family --node-ip and --bind-address leave open, where
// the default-route interface's address was (wrong on a node whose
// InternalIP is on another interface). Without a Node, or without the API
// server within nodeLookupTimeout, those the --state-file kept of the Node
// (a restart during an outage), else the default route.
func readNodeObjectIPs(ctx context.Context, client kubernetes.Interface, o *options, v *validated, isLocal func(netip.Addr) bool) {
	name := nodeName(o.hostnameOverride)
	ctx, cancel := context.WithTimeout(ctx, nodeLookupTimeout)
	defer cancel()
	node, err := config.ReadNode(ctx, client, name)
	if err != nil {
		if ips := stateFileNodeIPs(o.stateFile, name); len(ips) > 0 {
			// The Node as it was when the file was last written: a
			// restart during an outage keeps the node IPs it had.
			klog.InfoS("Could not read this node's Node object; node IPs from the --state-file", "node", name, "err", err)
			node = config.NodeInfo{Name: name, Addresses: ips}
		} else {
			klog.InfoS("Could not read this node's Node object; node IPs come from the default routes' source addresses", "node", name, "err", err)
			return
		}
	}
	var notLocal []netip.Addr
	v.nodeObjectRead = true
	v.nodeObjectZone = node.Zone
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
// object's (readNodeObjectIPs), else the default route's source address.
func hostIPOf(v *validated, six bool, fromRoute func() netip.Addr) netip.Addr {
	for _, ip := range v.nodeObjectIPs {
		if ip.Is4() != six {
			return ip
		}
	}
	return fromRoute()
}

// nodeIPsWatch compares the Node object's node IPs, as the informer
// delivers them, with the node IPs the portals were built with, for each
// family no flag decides. A difference needs a restart to reach the rules.
// When the Node was read at start and its addresses moved since, restart
// is called once (run returns its error and the process exits 1, as
// kube-proxy exits on a change of its node IPs so that its DaemonSet
// restarts it; rules and proxy ports are kept across it). When the Node
// could not be read at start (the API server away: the default route was
// taken), or without rules (restart nil), it is logged once: exiting then
// would stop a proxy that serves from its state file through an outage
// as soon as the API server is back.
type nodeIPsWatch struct {
	inUse       [2]netip.Addr // by family (0: IPv4, 1: IPv6); invalid: a flag decides it
	readAtStart bool
	isLocal     func(netip.Addr) bool
	restart     func(error) // nil: log only
	done        atomic.Bool
	// seen is the differing node IPs of the last look: a change is acted
	// on when a second look shows it too, so an address that is gone for
	// a moment (an interface down, a DHCP renewal) does not restart the
	// proxy, whose restart cuts the node's Service traffic. A look is an
	// update, or the last update looked at again recheck after it: a
	// kubelet reports a renumbering in one update and may send the next
	// minutes later (nodeStatusReportFrequency, 5 min), all that time
	// DNATing the node's Service traffic to an address it no longer has.
	mu      sync.Mutex
	seen    []netip.Addr
	last    config.NodeInfo
	recheck time.Duration
	timer   *time.Timer
}

// nodeIPsRecheck is nodeIPsWatch.recheck: as the default-route watch's
// second look (routeIPsWatch).
const nodeIPsRecheck = 5 * time.Second

// newNodeIPsWatch records the node IPs in use for the families --node-ip
// and --bind-address leave to the Node object (hostIPOf).
func newNodeIPsWatch(v *validated, isLocal func(netip.Addr) bool, restart func(error)) *nodeIPsWatch {
	return &nodeIPsWatch{isLocal: isLocal, restart: restart, readAtStart: v.nodeObjectRead, inUse: hostIPsInUse(v), recheck: nodeIPsRecheck}
}

// familyIndex is an address's index in the by-family arrays: 0 IPv4, 1 IPv6.
func familyIndex(ip netip.Addr) int {
	if ip.Unmap().Is4() {
		return 0
	}
	return 1
}

// hostIPsInUse is, by family (0: IPv4, 1: IPv6), the node IP the portals
// took from the Node object or the default route (hostIPOf); invalid for
// a family a flag decides (--bind-address naming an address, --node-ip).
// Once the portals were built it is theirs (portalNodeIPs): the default
// route read again could be another, or one where the portals had none,
// as it changed while start-up waited out the xtables lock (up to
// lockWait, while a CNI holds it at boot), and the watches then took the
// new address as the one in use and never restarted the proxy.
func hostIPsInUse(v *validated) (inUse [2]netip.Addr) {
	if v.bind.IsValid() && !v.bind.IsUnspecified() {
		return inUse // the bind address is the node IP
	}
	for i, f := range []struct {
		six   bool
		route func() netip.Addr
	}{{false, defaultRoutes.v4}, {true, defaultRoutes.v6}} {
		if v.nodeIP.IsValid() && v.nodeIP.Is4() != f.six {
			continue
		}
		if v.portalNodeIPsSet {
			inUse[i] = v.portalNodeIPs[i]
			continue
		}
		inUse[i] = hostIPOf(v, f.six, f.route)
	}
	return inUse
}

func (w *nodeIPsWatch) check(node config.NodeInfo) {
	// A Node without addresses says nothing (the state file's copy
	// carries only the zone; a Node being deleted keeps its own).
	if w == nil || w.done.Load() || node.Deleted || len(node.Addresses) == 0 {
		return
	}
	w.mu.Lock()
	w.last = node
	w.mu.Unlock()
	w.look(node)
}

// look compares node's IPs with those in use; a difference seen in two
// looks in a row restarts, and a first one schedules the second.
func (w *nodeIPsWatch) look(node config.NodeInfo) {
	ips, _ := nodeObjectIPs(node, w.isLocal)
	var differ []netip.Addr
	for _, ip := range ips {
		if i := familyIndex(ip); w.inUse[i].IsValid() && w.inUse[i] != ip {
			differ = append(differ, ip)
		}
	}
	w.mu.Lock()
	again := len(differ) > 0 && slices.Equal(differ, w.seen)
	w.seen = differ
	if len(differ) > 0 && !again && w.timer == nil && w.recheck > 0 {
		w.timer = time.AfterFunc(w.recheck, w.lookAgain)
	}
	w.mu.Unlock()
	if !again || !w.done.CompareAndSwap(false, true) {
		return
	}
	inUse := slices.DeleteFunc(slices.Clone(w.inUse[:]), func(a netip.Addr) bool { return !a.IsValid() })
	if w.restart == nil || !w.readAtStart {
		klog.InfoS("Warning: the Node's node IPs are not those in use; the proxy keeps the node IPs it started with until it restarts", "node", node.Name, "newNodeIPs", ips, "inUse", inUse)
		return
	}
	klog.InfoS("NodeIPs changed for the node; restarting, as kube-proxy does, so that the portals take them (rules and proxy ports are kept)", "node", node.Name, "newNodeIPs", ips, "inUse", inUse)
	w.restart(fmt.Errorf("the node IPs of Node %s (%v) are not those in use (%v): restart to take them", node.Name, ips, inUse))
}

// lookAgain is the second look at the last update, recheck after a first
// one showed a difference.
func (w *nodeIPsWatch) lookAgain() {
	w.mu.Lock()
	w.timer = nil
	last := w.last
	w.mu.Unlock()
	w.look(last)
}

// stateFileNodeIPs are the addresses of Node name kept in the state file
// (none without a file, or one written for another node).
func stateFileNodeIPs(path, name string) []netip.Addr {
	if path == "" {
		return nil
	}
	node, ips, err := config.ReadStateNode(path)
	if err != nil || node != name {
		return nil
	}
	return ips
}
