package iptables

import (
	"net/netip"
	"strconv"
	"strings"
)

// PortalKey is what a ClusterIP, externalIP or LoadBalancer-IP portal
// matches: its service port (the rule comment), protocol, address and port.
type PortalKey struct {
	Name     string
	Protocol Protocol
	IP       netip.Addr
	Port     int
}

// ProxyPortsInKernel reads the portals in the kernel (one dump) and returns
// the proxy port each one sends the node's own traffic to (KUBE-PORTALS-HOST
// and its buckets). A proxy started over the rules of the one before it
// listens on those ports again where it can: the rules are then already
// right, so its first sync rewrites nothing for them, and clients reach the
// new sockets as soon as they listen, before any write. A portal whose
// rules disagree (two ports) is left out.
func (r *Rules) ProxyPortsInKernel() (map[PortalKey]int, error) {
	data, err := r.runner.Save()
	if err != nil {
		return nil, err
	}
	nat, err := parseSave(data, TableNAT)
	if err != nil {
		return nil, err
	}
	out := map[PortalKey]int{}
	conflicting := map[PortalKey]bool{}
	for chain, rules := range nat.rules {
		if chain != ChainPortalsHost && !strings.HasPrefix(chain, ChainPortalsHost+"-") {
			continue
		}
		for _, rule := range rules {
			key, port, ok := portalProxyPort(rule)
			if !ok || conflicting[key] {
				continue
			}
			if had, seen := out[key]; seen && had != port {
				delete(out, key)
				conflicting[key] = true
				continue
			}
			out[key] = port
		}
	}
	return out, nil
}

// portalProxyPort reads a portal rule as rendered (renderPortal): its key
// and the proxy port of its DNAT or REDIRECT target. Rules with a source
// match (the externalTrafficPolicy: Local shortcut) or anything unexpected
// are not portals of one socket: ok is false.
func portalProxyPort(rule string) (key PortalKey, port int, ok bool) {
	args, err := splitRule(rule)
	if err != nil {
		return key, 0, false
	}
	for i := 0; i+1 < len(args); i++ {
		v := args[i+1]
		switch args[i] {
		case "-s", "!":
			return key, 0, false
		case "-d":
			p, err := netip.ParsePrefix(v)
			if err != nil || !p.IsSingleIP() {
				return key, 0, false
			}
			key.IP = p.Addr()
		case "-p":
			key.Protocol = Protocol(v)
		case "--comment":
			key.Name = v
		case "--dport":
			if key.Port, err = strconv.Atoi(v); err != nil {
				return key, 0, false
			}
		case "--to-destination":
			ap, err := netip.ParseAddrPort(v)
			if err != nil {
				return key, 0, false
			}
			port = int(ap.Port())
		case "--to-ports":
			if port, err = strconv.Atoi(v); err != nil {
				return key, 0, false
			}
		default:
			continue
		}
		i++
	}
	ok = key.Name != "" && key.IP.IsValid() && key.Port > 0 && port > 0 &&
		(key.Protocol == TCP || key.Protocol == UDP)
	return key, port, ok
}
