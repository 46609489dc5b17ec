package iptables

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"testing"
)

// referenceDesired is the rendering as it was before rules were cached per
// portal: one pass over all portals with one seen-set per chain. It is the
// oracle the cached rendering must match exactly.
func (r *Rules) referenceDesired(portals []Portal) chainRules {
	usable := r.usable(portals)
	want := chainRules{}
	seen := map[string]map[string]struct{}{} // per chain, rules already added
	for _, c := range ownedChains {
		want[c.name] = nil
		seen[c.name] = make(map[string]struct{}, len(usable))
	}
	add := func(chain, rule string) {
		if _, dup := seen[chain][rule]; !dup {
			seen[chain][rule] = struct{}{}
			want[chain] = append(want[chain], rule)
		}
	}
	nodePortDsts := r.nodePortDestinations()
	var podSrcs []string
	for _, c := range r.cfg.clusterCIDRs() {
		podSrcs = append(podSrcs, "-s "+c.String()+" ")
	}
	for _, p := range usable {
		proto := string(p.Protocol)
		protoComment := "-p " + proto + " -m comment --comment " + quoteSaveString(p.Name)
		dport := " -m " + proto + " --dport " + strconv.Itoa(p.Port) + " "
		proxyPorts := []int{p.ProxyPort}
		// portal writes one service address's rules: the shortcut of an
		// externalTrafficPolicy: Local portal first (pods' traffic in
		// PREROUTING; in OUTPUT every packet is the node's own, the
		// kernel's --src-type LOCAL, so there it simply replaces the
		// Local target), then the rule every other client meets.
		portal := func(container, host, dst string) {
			toHost := r.hostTarget(p.ProxyPort)
			if p.ClusterProxyPort != 0 {
				for _, src := range podSrcs {
					add(container, src+dst+protoComment+dport+r.containerTarget(p.ClusterProxyPort))
				}
				toHost = r.hostTarget(p.ClusterProxyPort)
			}
			add(container, dst+protoComment+dport+r.containerTarget(p.ProxyPort))
			add(host, dst+protoComment+dport+toHost)
		}
		if p.ClusterProxyPort != 0 {
			proxyPorts = append(proxyPorts, p.ClusterProxyPort)
		}
		if p.NodePort {
			for _, dst := range nodePortDsts {
				portal(ChainNodePortContainer, ChainNodePortHost, dst)
			}
			for _, port := range proxyPorts {
				add(ChainNodePortNonLocal, protoComment+" -m "+proto+" --dport "+strconv.Itoa(port)+" -j ACCEPT")
			}
		} else {
			portal(ChainPortalsContainer, ChainPortalsHost, "-d "+netip.PrefixFrom(p.IP.Unmap(), r.cfg.Family.hostBits()).String()+" ")
		}
		// REDIRECT sets the conntrack DNAT status too, so everything that came
		// through a portal passes; a direct connection to the proxy port does
		// not. Only NEW flows are judged: the rules outlive the proxy, and a
		// node connection that later got a former proxy port as its source
		// port must still receive its replies.
		for _, port := range proxyPorts {
			add(ChainProxyPortGuard, "-p "+proto+" -m "+proto+" --dport "+strconv.Itoa(port)+
				" -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -j DROP")
		}
	}
	return want
}

// The cached rendering equals the reference on random portal sets, also
// when each set is rendered right after another (so cached portals are
// reused beside new ones).
func TestDesiredMatchesReference(t *testing.T) {
	cfgs := []Config{
		testConfig,
		{Family: IPv4, NodeIP: netip.MustParseAddr("192.168.1.10"), ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.245.0.0/16")},
			NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("10.0.0.0/8")}},
		{Family: IPv6, NodeIP: netip.MustParseAddr("fd00:1::10")},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"a/x:http", "a/x:dns", "b/y:http", `c/"q z":p`, "d/w:"}
	randomPortal := func() Portal {
		p := Portal{
			Name:      names[rng.IntN(len(names))],
			Protocol:  []Protocol{TCP, UDP}[rng.IntN(2)],
			Port:      80 + rng.IntN(3),
			ProxyPort: 40000 + rng.IntN(4),
		}
		switch rng.IntN(4) {
		case 0:
			p.NodePort = true
			p.Port = 30000 + rng.IntN(3)
		case 1:
			p.IP = netip.MustParseAddr("fd00::" + strconv.Itoa(1+rng.IntN(3)))
		default:
			p.IP = netip.AddrFrom4([4]byte{10, 96, 0, byte(1 + rng.IntN(3))})
		}
		if rng.IntN(3) == 0 {
			p.ClusterProxyPort = 40000 + rng.IntN(4)
		}
		return p
	}
	for _, cfg := range cfgs {
		r := New(NewFakeRunner(cfg.Family), cfg)
		for range 500 {
			portals := make([]Portal, rng.IntN(12))
			for i := range portals {
				portals[i] = randomPortal()
			}
			want, got := r.referenceDesired(portals), r.desired(portals)
			for _, c := range ownedChains {
				if !slices.Equal(got[c.name], want[c.name]) {
					t.Fatalf("%v %s for %+v:\n got %q\nwant %q", cfg.Family, c.name, portals, got[c.name], want[c.name])
				}
			}
		}
	}
}
