package proxier

import (
	"net"
	"net/netip"
	"testing"
	"time"

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
			to := netip.AddrPortFrom(netip.MustParseAddr(tc.to), uint16(sock.Port()))
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
				if from.Addr().Unmap() != to.Addr() {
					t.Fatalf("datagram %d to %v: reply from %v, want from the address the client sent to", i, to, from)
				}
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
