package proxier

import (
	"bytes"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// On a node with two addresses on one interface, a wildcard socket's reply
// to a client that sent to the secondary address must come from it: the
// route would pick the primary, and conntrack could not reverse the NAT.
func TestUDPRepliesLeaveFromTheAddressTheClientSentTo(t *testing.T) {
	netns.Require(t)
	lab := netns.New(t)
	node, client := lab.NS("node"), lab.NS("client")
	for _, ns := range []*netns.NS{node, client} {
		// No duplicate address detection: the IPv6 addresses work at once.
		ns.Sysctl("net.ipv6.conf.all.accept_dad", "0")
		ns.Sysctl("net.ipv6.conf.default.accept_dad", "0")
	}
	pfx := netip.MustParsePrefix
	netns.Veth(
		netns.End{NS: node, If: "eth0", Addrs: []netip.Prefix{pfx("10.78.0.1/24"), pfx("10.78.0.2/24"), pfx("fd78::1/64"), pfx("fd78::2/64")}},
		netns.End{NS: client, If: "eth0", Addrs: []netip.Prefix{pfx("10.78.0.10/24"), pfx("fd78::10/64")}},
	)
	// The backend runs in the root namespace: the proxy opens backend
	// sockets from its own goroutines, which run there. Only the service
	// socket is the node's.
	echo := startUDPEcho(t, "127.0.0.2:0", "")

	for _, tc := range []struct {
		name, network string
		from, to      string
	}{
		{"IPv4 socket, secondary address", "udp4", "10.78.0.10", "10.78.0.2"},
		{"IPv4 socket, primary address", "udp4", "10.78.0.10", "10.78.0.1"},
		{"dual-stack socket, IPv4 client", "udp", "10.78.0.10", "10.78.0.2"},
		{"dual-stack socket, IPv6 secondary address", "udp", "fd78::10", "fd78::2"},
		{"dual-stack socket, IPv6 primary address", "udp", "fd78::10", "fd78::1"},
		// The node's link-local address (a --node-ip fe80::..., a REDIRECT
		// on a link with no other IPv6 address): its replies failed
		// (sendmmsg EINVAL) without the interface they leave on.
		{"dual-stack socket, IPv6 link-local address", "udp", "fd78::10", "link-local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var conn *net.UDPConn
			if err := node.Do(func() (err error) {
				conn, err = net.ListenUDP(tc.network, &net.UDPAddr{})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			sock := startUDPSocket(t, conn, netip.MustParseAddrPort(echo.LocalAddr().String()))
			c, err := client.ListenUDP(netip.MustParseAddr(tc.from))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var to netip.AddrPort
			if tc.to == "link-local" {
				to = netip.AddrPortFrom(linkLocalOf(t, node, client, "eth0"), uint16(sock.Port()))
			} else {
				to = netip.AddrPortFrom(netip.MustParseAddr(tc.to), uint16(sock.Port()))
			}
			// The first datagram opens the session,
			// the second uses it.
			for i := range 2 {
				if _, err := c.WriteToUDPAddrPort([]byte("q"), to); err != nil {
					t.Fatal(err)
				}
				_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
				buf := make([]byte, 16)
				_, from, err := c.ReadFromUDPAddrPort(buf)
				if err != nil {
					t.Fatalf("datagram %d: no reply: %v", i, err)
				}
				if from.Addr().Unmap().WithZone("") != to.Addr().WithZone("") {
					t.Fatalf("datagram %d to %v: reply from %v, want from the address the client sent to", i, to, from)
				}
			}
		})
	}
}

// linkLocalOf is the link-local address of node's interface, zoned for
// peer's end of the link, which has the same name (a numeric zone: a
// name would be looked up in the test's namespace, not peer's). It waits
// for both ends' link-local addresses, which come a moment after the link.
func linkLocalOf(t *testing.T, node, peer *netns.NS, ifName string) netip.Addr {
	t.Helper()
	ll, _ := waitLinkLocal(t, node, ifName)
	_, index := waitLinkLocal(t, peer, ifName)
	return ll.WithZone(strconv.Itoa(index))
}

// waitLinkLocal returns the link-local address of ns's interface and the
// interface's index.
func waitLinkLocal(t *testing.T, ns *netns.NS, ifName string) (netip.Addr, int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var ll netip.Addr
		var index int
		if err := ns.Do(func() error {
			ifi, err := net.InterfaceByName(ifName)
			if err != nil {
				return err
			}
			index = ifi.Index
			addrs, err := ifi.Addrs()
			for _, a := range addrs {
				if p, perr := netip.ParsePrefix(a.String()); perr == nil && p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
					ll = p.Addr()
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if ll.IsValid() {
			return ll, index
		}
	}
	t.Fatalf("no link-local address on %s in %s", ifName, ns.Name)
	return netip.Addr{}, 0
}

// A reply's source is the address the client sent to, and from a
// link-local one it leaves on the interface the datagram came in on: the
// kernel cannot send from a link-local source without its link (EINVAL).
// A global source leaves the output interface to the route, which need
// not be the arrival one (asymmetric routing).
func TestReplyControlCarriesTheLinkOfALinkLocalSource(t *testing.T) {
	for _, tc := range []struct {
		name        string
		dst         string
		ifIndex     int
		wantIfIndex int
	}{
		{"link-local destination", "fe80::1", 7, 7},
		{"global destination", "fd00::1", 7, 0},
		{"unique local destination", "fd78::2", 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A received IPV6_PKTINFO has the sent one's layout (struct in6_pktinfo).
			oob := (&ipv6.ControlMessage{Src: net.ParseIP(tc.dst), IfIndex: tc.ifIndex}).Marshal()
			var cm ipv6.ControlMessage
			var buf [replyControlWords]uint64
			if err := cm.Parse(putReplyControl(&buf, oob)); err != nil {
				t.Fatal(err)
			}
			if !cm.Dst.Equal(net.ParseIP(tc.dst)) || cm.IfIndex != tc.wantIfIndex {
				t.Errorf("reply pktinfo: source %v, ifindex %d; want %s, %d", cm.Dst, cm.IfIndex, tc.dst, tc.wantIfIndex)
			}
		})
	}
}

// A session's reply control message is what x/net's Marshal wrote, and
// x/sys's PktInfo4 and PktInfo6 write, for both families (a link-local IPv6
// source with its arrival interface), and costs no allocation:
// replyControl cost every new session of a socket on the wildcard address
// (the default) three, 32 or 40 bytes.
func TestPutReplyControlMatchesMarshalWithoutAllocating(t *testing.T) {
	oob4 := ipv4.NewControlMessage(ipv4.FlagDst)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob4[0]))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	(*unix.Inet4Pktinfo)(unsafe.Pointer(&oob4[unix.CmsgLen(0)])).Addr = [4]byte{10, 0, 0, 1}
	for _, tc := range []struct {
		name          string
		oob           []byte
		want, wantSys []byte
	}{
		{"IPv4", oob4, (&ipv4.ControlMessage{Src: net.IPv4(10, 0, 0, 1)}).Marshal(),
			unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: [4]byte{10, 0, 0, 1}})},
		{"IPv6 global", (&ipv6.ControlMessage{Src: net.ParseIP("fd00::1"), IfIndex: 7}).Marshal(),
			(&ipv6.ControlMessage{Src: net.ParseIP("fd00::1")}).Marshal(),
			unix.PktInfo6(&unix.Inet6Pktinfo{Addr: netip.MustParseAddr("fd00::1").As16()})},
		{"IPv6 link-local", (&ipv6.ControlMessage{Src: net.ParseIP("fe80::1"), IfIndex: 7}).Marshal(),
			(&ipv6.ControlMessage{Src: net.ParseIP("fe80::1"), IfIndex: 7}).Marshal(),
			unix.PktInfo6(&unix.Inet6Pktinfo{Addr: netip.MustParseAddr("fe80::1").As16(), Ifindex: 7})},
		{"none", nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf [replyControlWords]uint64
			if got := putReplyControl(&buf, tc.oob); !bytes.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Fatalf("control message\n%x, want\n%x", got, tc.want)
			}
			if got := putReplyControl(&buf, tc.oob); !bytes.Equal(got, tc.wantSys) {
				t.Fatalf("control message\n%x, x/sys's PktInfo\n%x", got, tc.wantSys)
			}
			if n := testing.AllocsPerRun(100, func() { putReplyControl(&buf, tc.oob) }); n != 0 {
				t.Fatalf("%v allocations", n)
			}
		})
	}
}

// startUDPSocket serves conn as a service port whose one endpoint is
// backend, without a Proxier (so conn may come from another namespace).
func startUDPSocket(t *testing.T, conn *net.UDPConn, backend netip.AddrPort) *udpProxySocket {
	t.Helper()
	name := loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "dns"}, Port: "p", Protocol: v1.ProtocolUDP}
	lb := loadbalancer.New(clock.RealClock{}, loadbalancer.Limits{})
	sp := lb.ServicePort(name)
	lb.SetEndpoints(name, []loadbalancer.Endpoint{{Addr: backend, Ready: true, Serving: true}})
	cfg := &socketConfig{
		dialTimeouts: defaultDialTimeouts, udpIdleTimeout: time.Minute, metrics: NewMetrics(),
		udpMaxSessionsPerPort: 16, udpBudget: newUDPBudget(16),
	}
	sock, err := newUDPProxySocket(name, conn, sp, nil, cfg)
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	go sock.Serve()
	t.Cleanup(func() { sock.Close() })
	return sock
}
