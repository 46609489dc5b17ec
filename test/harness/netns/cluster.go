package netns

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// Cluster is the standard one-node lab of the end-to-end and bench tests:
//
//	pod1 ──┐                      ┌── backends (b1..bN on their own IPs)
//	pod2 ──┼── node (proxy runs) ─┤
//	external ┘                    └── (node's default route points here)
//
// Pods and the external host route everything via the node, so their traffic
// enters the node's PREROUTING; the node routes everything it does not know
// (ClusterIPs included) towards the backends side, so its NodeIP — the
// address on the default-route interface — is well defined. ip_forward is on
// in the node. Only addresses in 10.77.0.0/16 and the Services' virtual IPs
// are ever used, and they exist only inside these namespaces.
type Cluster struct {
	Lab *Lab

	Node, Pod1, Pod2, Backends, External *NS

	NodeIP         netip.Addr    // node address on the default-route (backends) link
	NodeExternalIP netip.Addr    // node address on the external link
	NodePodIP      [2]netip.Addr // node address on the pod1 / pod2 links
	Pod1IPs        []netip.Addr  // pod1's addresses; [0] is primary, the rest are extra client IPs
	Pod2IPs        []netip.Addr
	ExternalIP     netip.Addr   // the external host's address
	BackendIPs     []netip.Addr // one per backend, all on the backends namespace
	DeadIP         netip.Addr   // on the backends namespace, nothing ever listens there

	// CalicoPod is a pod linked as Calico links pods (ClusterOptions.CalicoPod;
	// nil otherwise): see addCalicoPod.
	CalicoPod   *NS
	CalicoPodIP netip.Addr

	// V6 holds the IPv6 addresses of a dual-stack cluster
	// (ClusterOptions.DualStack); nil otherwise.
	V6 *IPv6
}

// ClusterOptions sizes a Cluster. Zero values take the defaults.
type ClusterOptions struct {
	Backends      int // default 4
	ClientIPsEach int // addresses per pod (primary included), default 32
	// CalicoPod adds a third pod whose host-side veth has no address
	// (Calico's and the AWS VPC CNI's shape), beside pod1 and pod2.
	CalicoPod bool
	// DualStack adds IPv6 to every link (see IPv6).
	DualStack bool
}

// NewCluster builds the topology (no processes yet). Everything is removed in
// t.Cleanup.
func NewCluster(t testing.TB, opt ClusterOptions) *Cluster {
	t.Helper()
	if opt.Backends == 0 {
		opt.Backends = 4
	}
	if opt.ClientIPsEach == 0 {
		opt.ClientIPsEach = 32
	}
	if opt.Backends > 40 || opt.ClientIPsEach > 200 {
		t.Fatalf("netns: cluster too large: %+v", opt)
	}
	lab := New(t)
	c := &Cluster{Lab: lab}
	c.Node = lab.NS("node")
	c.Pod1 = lab.NS("pod1")
	c.Pod2 = lab.NS("pod2")
	c.Backends = lab.NS("back")
	c.External = lab.NS("ext")

	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	pfx := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 24) }

	// node <-> backends; backend IPs are extra addresses on the backends side.
	c.NodeIP = ip("10.77.1.1")
	backSide := []netip.Prefix{pfx(ip("10.77.1.2"))}
	for i := 0; i < opt.Backends; i++ {
		a := ip(fmt.Sprintf("10.77.1.%d", 11+i))
		c.BackendIPs = append(c.BackendIPs, a)
		backSide = append(backSide, pfx(a))
	}
	c.DeadIP = ip("10.77.1.99")
	backSide = append(backSide, pfx(c.DeadIP))
	Veth(End{c.Node, "kb0", []netip.Prefix{pfx(c.NodeIP)}}, End{c.Backends, "eth0", backSide})

	// node <-> pods, each pod with extra client addresses.
	pods := []*NS{c.Pod1, c.Pod2}
	for i, pod := range pods {
		gw := ip(fmt.Sprintf("10.77.%d.1", 11+i))
		c.NodePodIP[i] = gw
		var addrs []netip.Addr
		var pfxs []netip.Prefix
		for j := 0; j < opt.ClientIPsEach; j++ {
			a := ip(fmt.Sprintf("10.77.%d.%d", 11+i, 2+j))
			addrs = append(addrs, a)
			pfxs = append(pfxs, pfx(a))
		}
		Veth(End{c.Node, fmt.Sprintf("kp%d", i+1), []netip.Prefix{pfx(gw)}}, End{pod, "eth0", pfxs})
		pod.Route("default", gw)
		if i == 0 {
			c.Pod1IPs = addrs
		} else {
			c.Pod2IPs = addrs
		}
	}

	// node <-> external host.
	c.NodeExternalIP = ip("10.77.2.1")
	c.ExternalIP = ip("10.77.2.2")
	Veth(End{c.Node, "ke0", []netip.Prefix{pfx(c.NodeExternalIP)}}, End{c.External, "eth0", []netip.Prefix{pfx(c.ExternalIP)}})
	c.External.Route("default", c.NodeExternalIP)

	c.Node.Route("default", ip("10.77.1.2"))
	c.Backends.Route("10.77.0.0/16", c.NodeIP)
	c.Node.Sysctl("net.ipv4.ip_forward", "1")
	if opt.CalicoPod {
		c.addCalicoPod()
	}
	if opt.DualStack {
		c.addIPv6(opt.Backends)
	}
	return c
}

// Backend is one running backend process.
type Backend struct {
	Name string
	Addr netip.AddrPort
	Proc *Proc
}

// StartBackends starts one backend process (the test/tools/backend binary)
// per BackendIPs entry, named b1, b2, ..., listening on port for TCP and UDP,
// with flags added to each one's command line (such as -udp-delay), and
// waits until each answers from the node.
func (c *Cluster) StartBackends(t testing.TB, bin string, port uint16, flags ...string) []Backend {
	t.Helper()
	var bs []Backend
	for i, a := range c.BackendIPs {
		b := Backend{Name: fmt.Sprintf("b%d", i+1), Addr: netip.AddrPortFrom(a, port)}
		b.Proc = c.Backends.Start(b.Name, bin, append([]string{"-name", b.Name, "-addr", b.Addr.String()}, flags...)...)
		bs = append(bs, b)
	}
	for _, b := range bs {
		WaitTCP(t, c.Node, b.Addr, 5*time.Second)
	}
	return bs
}

// WaitTCP waits until a TCP connection from ns to addr succeeds.
func WaitTCP(t testing.TB, ns *NS, addr netip.AddrPort, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		conn, err := ns.DialTCP(ctx, netip.Addr{}, addr)
		cancel()
		if err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("netns: %s not reachable from %s within %v: %v", addr, ns.Name, within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
