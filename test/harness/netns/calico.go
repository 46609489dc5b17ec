package netns

import "net/netip"

// calicoGateway is the next hop every Calico pod routes through. No host
// holds it: the host side of the pod's veth answers ARP for it by proxy.
var calicoGateway = netip.MustParseAddr("169.254.1.1")

// addCalicoPod links the pod namespace "calico" to the node the way Calico
// and the AWS VPC CNI do, unlike the pod1/pod2 links: the host-side veth has
// no address, answers ARP by proxy (at once, not after proxy_delay), the
// node reaches the pod by a /32 route on that veth, and the pod holds a /32
// and a default route via 169.254.1.1 on its eth0. A REDIRECT of a packet
// arriving on such a veth finds no address to redirect to and drops it.
func (c *Cluster) addCalicoPod() {
	c.CalicoPod = c.Lab.NS("calico")
	c.CalicoPodIP = netip.MustParseAddr("10.77.13.2")
	const hostIf = "cali1"
	Veth(End{c.Node, hostIf, nil}, End{c.CalicoPod, "eth0", []netip.Prefix{netip.PrefixFrom(c.CalicoPodIP, 32)}})
	c.Node.Sysctl("net.ipv4.conf."+hostIf+".proxy_arp", "1")
	c.Node.Sysctl("net.ipv4.neigh."+hostIf+".proxy_delay", "0")
	c.Node.MustIP("route", "add", netip.PrefixFrom(c.CalicoPodIP, 32).String(), "dev", hostIf)
	c.CalicoPod.MustIP("route", "add", calicoGateway.String(), "dev", "eth0", "scope", "link")
	c.CalicoPod.MustIP("route", "add", "default", "via", calicoGateway.String(), "dev", "eth0", "onlink")
}
