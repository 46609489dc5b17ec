package netns

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// IPv6 is the IPv6 side of a dual-stack Cluster (ClusterOptions.DualStack):
// every link of the IPv4 lab also carries an fd77::/16 address, with the
// same roles. Addresses are added without duplicate address detection, so
// they are usable at once.
type IPv6 struct {
	NodeIP         netip.Addr    // node address on the default-route (backends) link
	NodeExternalIP netip.Addr    // node address on the external link
	NodePodIP      [2]netip.Addr // node address on the pod1 / pod2 links
	Pod1IPs        []netip.Addr
	Pod2IPs        []netip.Addr
	ExternalIP     netip.Addr
	BackendIPs     []netip.Addr
}

// ipv6ClientsEach is how many IPv6 addresses each pod gets.
const ipv6ClientsEach = 8

// addIPv6 gives every link of c an IPv6 address and the node a default
// IPv6 route towards the backends, as addresses and routes of IPv4 do.
func (c *Cluster) addIPv6(backends int) {
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	pfx := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 64) }
	v6 := &IPv6{NodeIP: ip("fd77:1::1"), NodeExternalIP: ip("fd77:2::1"), ExternalIP: ip("fd77:2::2")}
	addAddr := func(ns *NS, ifname string, a netip.Addr) {
		ns.MustIP("-6", "addr", "add", pfx(a).String(), "dev", ifname, "nodad")
	}
	addAddr(c.Node, "kb0", v6.NodeIP)
	addAddr(c.Backends, "eth0", ip("fd77:1::2"))
	for i := 0; i < backends; i++ {
		a := ip(fmt.Sprintf("fd77:1::%x", 0x11+i))
		v6.BackendIPs = append(v6.BackendIPs, a)
		addAddr(c.Backends, "eth0", a)
	}
	for i, pod := range []*NS{c.Pod1, c.Pod2} {
		gw := ip(fmt.Sprintf("fd77:%x::1", 0x11+i))
		v6.NodePodIP[i] = gw
		addAddr(c.Node, fmt.Sprintf("kp%d", i+1), gw)
		var addrs []netip.Addr
		for j := 0; j < ipv6ClientsEach; j++ {
			a := ip(fmt.Sprintf("fd77:%x::%x", 0x11+i, 2+j))
			addrs = append(addrs, a)
			addAddr(pod, "eth0", a)
		}
		pod.MustIP("-6", "route", "add", "default", "via", gw.String())
		if i == 0 {
			v6.Pod1IPs = addrs
		} else {
			v6.Pod2IPs = addrs
		}
	}
	addAddr(c.Node, "ke0", v6.NodeExternalIP)
	addAddr(c.External, "eth0", v6.ExternalIP)
	c.External.MustIP("-6", "route", "add", "default", "via", v6.NodeExternalIP.String())
	c.Node.MustIP("-6", "route", "add", "default", "via", "fd77:1::2")
	c.Backends.MustIP("-6", "route", "add", "fd77::/16", "via", v6.NodeIP.String())
	c.Node.Sysctl("net.ipv6.conf.all.forwarding", "1")
	c.V6 = v6
}

// StartBackends6 starts one backend per IPv6 backend address, named b1v6,
// b2v6, ..., so an answer says which family served it.
func (c *Cluster) StartBackends6(t testing.TB, bin string, port uint16) []Backend {
	t.Helper()
	var bs []Backend
	for i, a := range c.V6.BackendIPs {
		b := Backend{Name: fmt.Sprintf("b%dv6", i+1), Addr: netip.AddrPortFrom(a, port)}
		b.Proc = c.Backends.Start(b.Name, bin, "-name", b.Name, "-addr", b.Addr.String())
		bs = append(bs, b)
	}
	for _, b := range bs {
		WaitTCP(t, c.Node, b.Addr, 5*time.Second)
	}
	return bs
}
