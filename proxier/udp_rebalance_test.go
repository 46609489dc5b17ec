package proxier

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// A client that keeps sending while its endpoint is replaced moves to the
// new endpoint at once, as kube-proxy's conntrack cleanup moves it; before,
// 2 s of traffic after the update all went to the removed endpoint.
func TestUDPSessionLeavesRemovedEndpoint(t *testing.T) {
	a := startUDPEcho(t, "127.0.0.2:0", "a:")
	port := portOf(a.LocalAddr())
	startUDPEcho(t, "127.0.0.3:"+port, "b:")
	p := newTestProxier(t, Options{UDPIdleTimeout: time.Minute})
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, "127.0.0.2:"+port))
	p.Sync()
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(proxyAddr(t, p, "default/dns:p"))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// One datagram every 5 ms, each answered before the next.
	ask := func() string {
		t.Helper()
		time.Sleep(5 * time.Millisecond)
		if _, err := c.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		buf := make([]byte, 16)
		n, err := c.Read(buf)
		if err != nil {
			return "" // lost: asked again
		}
		return strings.TrimSuffix(string(buf[:n]), "q")
	}
	for range 10 {
		if got := ask(); got != "a:" {
			t.Fatalf("before the update: reply from %q, want a:", got)
		}
	}

	p.OnEndpointSliceUpdate(nil, makeSlice("dns", v1.ProtocolUDP, "127.0.0.3:"+port))
	updated := time.Now()
	for ask() != "b:" {
		if time.Since(updated) > 2*time.Second {
			t.Fatal("2 s after endpoint a was replaced by b, the client's datagrams still reach a")
		}
	}
	t.Logf("first reply from b %v after the update", time.Since(updated).Round(time.Millisecond))
	if d := time.Since(updated); d > time.Second {
		t.Fatalf("the first reply from b came %v after the update, want within 1 s", d)
	}
	for i := range 20 {
		if got := ask(); got != "b:" && got != "" {
			t.Fatalf("datagram %d after moving to b answered by %q", i, got)
		}
	}
}

// A session keeps its endpoint when the endpoints change without removing
// it (another pod added, or its readiness changed): only a removed
// endpoint's flows move, as kube-proxy deletes only their conntrack
// entries. Re-balanced at every change, each scale-up moved every live
// UDP flow (a QUIC connection) to another endpoint at its next datagram.
func TestUDPSessionKeepsItsEndpointAcrossAnUnrelatedChange(t *testing.T) {
	a := startUDPEcho(t, "127.0.0.2:0", "a:")
	b := startUDPEcho(t, "127.0.0.3:"+portOf(a.LocalAddr()), "b:")
	ip := newInflightPort(t, time.Minute, a.LocalAddr().(*net.UDPAddr).AddrPort())
	ip.send("q")
	sess := ip.session()
	if sess == nil {
		t.Fatal("no session after the first datagram")
	}
	ip.setEndpoints(a.LocalAddr().(*net.UDPAddr).AddrPort(), b.LocalAddr().(*net.UDPAddr).AddrPort())
	ip.send("q")
	if got := ip.session(); got != sess || sess.fd < 0 {
		t.Fatalf("after endpoint b was added, the client's session is %p (was %p, its socket %d): re-balanced although endpoint a stays", got, sess, sess.fd)
	}
}

// A socket switched to another balancer (a retired external socket, which
// serves from the service port's own until its rules move) checks its
// sessions' endpoints against the new one: their generations were the old
// balancer's, a count of its own, and where the numbers happened to agree a
// session to an endpoint the new balancer does not hold went on to it.
func TestUDPSocketOnANewBalancerRechecksItsSessions(t *testing.T) {
	a := startUDPEcho(t, "127.0.0.2:0", "a:")
	b := startUDPEcho(t, "127.0.0.3:"+portOf(a.LocalAddr()), "b:")
	ip := newInflightPort(t, time.Minute, a.LocalAddr().(*net.UDPAddr).AddrPort())
	other := ip.name
	other.Name = "dns-other"
	ip.lb.SetEndpoints(other, []loadbalancer.Endpoint{{Addr: b.LocalAddr().(*net.UDPAddr).AddrPort(), Ready: true, Serving: true}})
	next := ip.lb.ServicePort(other)
	if ip.sock.sp.Generation() != next.Generation() {
		t.Fatalf("generations %d and %d: the test needs them equal", ip.sock.sp.Generation(), next.Generation())
	}
	ip.send("q")
	ip.sock.useBalancer(next)
	ip.send("q")
	var got netip.AddrPort // none: no session
	if sess := ip.session(); sess != nil {
		got = sess.backend
	}
	if got != b.LocalAddr().(*net.UDPAddr).AddrPort() {
		t.Fatalf("after the switch to a balancer holding only b, the client's session goes to %v", got)
	}
}
