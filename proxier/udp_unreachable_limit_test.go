package proxier

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// TestUnreachablePerDestination: a flood of datagrams from one address (a
// forged source: the victim's) to a port without endpoints draws at most
// the kernel's burst of errors to that address, and the errors other
// clients are owed are still there. With the global bound alone, the
// flood's address got them all (the global burst, and 1,000 a second
// after it) and the next client none. The global limiter here grants its
// burst and never refills, so the counts do not depend on timing.
func TestUnreachablePerDestination(t *testing.T) {
	netns.Require(t)
	lab := netns.New(t)
	node, client := lab.NS("node"), lab.NS("client")
	pfx := netip.MustParsePrefix
	netns.Veth(
		netns.End{NS: node, If: "eth0", Addrs: []netip.Prefix{pfx("10.78.0.1/24")}},
		netns.End{NS: client, If: "eth0", Addrs: []netip.Prefix{pfx("10.78.0.10/24"), pfx("10.78.0.11/24")}},
	)
	flooder, other := netip.MustParseAddr("10.78.0.10"), netip.MustParseAddr("10.78.0.11")

	u := newUnreachableSender()
	u.limit = rate.NewLimiter(0, unreachableBurst)
	t.Cleanup(u.close)
	var conn *net.UDPConn
	// The raw socket is opened in the node's namespace, where its errors
	// are routed (opened by the serving goroutine, it would be the test
	// process's namespace's).
	if err := node.Do(func() (err error) {
		u.mu.Lock()
		fd := u.socketLocked(0)
		u.mu.Unlock()
		if fd < 0 {
			return errors.New("no raw ICMP socket")
		}
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	name := loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "dns"}, Port: "p", Protocol: v1.ProtocolUDP}
	sp := loadbalancer.New(clock.RealClock{}, loadbalancer.Limits{}).ServicePort(name) // no endpoints
	cfg := &socketConfig{
		dialTimeouts: defaultDialTimeouts, udpIdleTimeout: time.Minute, metrics: NewMetrics(),
		udpMaxSessionsPerPort: 16, udpBudget: newUDPBudget(16), unreachable: u,
	}
	sock, err := newUDPProxySocket(name, conn, sp, nil, cfg)
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	go sock.Serve()
	t.Cleanup(func() { sock.Close() })
	to := netip.AddrPortFrom(netip.MustParseAddr("10.78.0.1"), uint16(sock.Port()))

	// Every ICMP message the client namespace receives, whoever it is for.
	var icmp int
	if err := client.Do(func() (err error) {
		icmp, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(icmp)

	// The flood: from one socket that reads no errors (as a forged source).
	f, err := client.ListenUDP(flooder)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const flood = 2 * unreachableBurst
	for range flood {
		if _, err := f.WriteToUDPAddrPort([]byte("q"), to); err != nil {
			t.Fatal(err)
		}
	}
	// Then another client, whose error comes after the flood's (one
	// goroutine serves the port, in order, and one link carries them).
	var o *net.UDPConn
	if err := client.Do(func() (err error) {
		o, err = net.DialUDP("udp4", &net.UDPAddr{IP: other.AsSlice()}, net.UDPAddrFromAddrPort(to))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := o.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	_ = o.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := o.Read(make([]byte, 16)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the next client's read after the flood: %v, want ECONNREFUSED (its port unreachable)", err)
	}

	got := map[netip.Addr]int{}
	buf := make([]byte, 1500)
	for {
		n, _, err := unix.Recvfrom(icmp, buf, unix.MSG_DONTWAIT)
		if err != nil {
			break
		}
		// IPv4 header, then ICMP type 3 code 3; counted by destination.
		if n >= 28 && buf[20] == 3 && buf[21] == 3 {
			got[netip.AddrFrom4([4]byte(buf[16:20]))]++
		}
	}
	if n := got[flooder]; n == 0 || n > unreachableDestinationBurst {
		t.Errorf("%d port unreachables to the flooding address for %d datagrams, want 1 to %d (the kernel's per-destination burst)", n, flood, unreachableDestinationBurst)
	}
	if got[other] != 1 {
		t.Errorf("%d port unreachables to the next client, want 1", got[other])
	}
}

// The bucket grants its burst, then one per interval, per address; an
// address sharing no bucket keeps its own; errors to the node itself are
// not held. It allocates nothing and takes no lock.
func TestDestinationLimiter(t *testing.T) {
	d := newDestinationLimiter()
	local := netip.MustParseAddr("10.0.0.1")
	a, b := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00::5")
	now := int64(time.Hour)
	allowed := func(dst netip.Addr, at int64, n int) int {
		got := 0
		for range n {
			if d.allow(dst, local, at) {
				got++
			}
		}
		return got
	}
	if got := allowed(a, now, 100); got != unreachableDestinationBurst {
		t.Fatalf("%d of 100 allowed at once, want the burst %d", got, unreachableDestinationBurst)
	}
	if got := allowed(b, now, 100); got != unreachableDestinationBurst {
		t.Fatalf("another address: %d of 100 allowed, want its own burst %d", got, unreachableDestinationBurst)
	}
	if got := allowed(a, now+int64(unreachableDestinationInterval)-1, 10); got != 0 {
		t.Fatalf("%d allowed before an interval passed, want 0", got)
	}
	if got := allowed(a, now+int64(unreachableDestinationInterval), 10); got != 1 {
		t.Fatalf("%d allowed an interval later, want 1", got)
	}
	if got := allowed(a, now+100*int64(unreachableDestinationInterval), 100); got != unreachableDestinationBurst {
		t.Fatalf("%d allowed after a long pause, want the burst %d again, no more", got, unreachableDestinationBurst)
	}
	for _, self := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"), local, netip.MustParseAddr("::ffff:10.0.0.1")} {
		if got := allowed(self, now, 100); got != 100 {
			t.Errorf("%v (the node itself): %d of 100 allowed, want all", self, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() { d.allow(a, local, now) }); n != 0 {
		t.Errorf("%v allocations per check", n)
	}
}
