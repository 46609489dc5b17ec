package proxier

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// restoreProbe runs check before each rule write.
type restoreProbe struct {
	*iptables.FakeRunner
	check func()
}

func (r restoreProbe) Restore(data []byte) error {
	r.check()
	return r.FakeRunner.Restore(data)
}

// When externalTrafficPolicy goes from Local to Cluster, the second socket
// serves until the rules send its NodePort (external IPs, LB IPs) to the
// service port's socket: it was closed first, and a UDP client of the
// NodePort was refused (ICMP port unreachable) until the rules were written
// and its conntrack entry cleared (one source port at 500 datagrams/s
// through the real binary: 16 lost, 6 of them refused, at each such
// change), where kube-proxy serves it across the change. Kept open alone,
// it refused them itself: its endpoints went with the policy.
func TestExternalSocketServesUntilTheRulesMove(t *testing.T) {
	startUDPEcho(t, "127.0.0.2:20054", "local:")
	startUDPEcho(t, "127.0.0.3:20054", "remote:")
	extPort := 0
	var during error
	fake := iptables.NewFakeRunner(iptables.IPv4)
	probe := restoreProbe{FakeRunner: fake, check: func() {
		if extPort == 0 || during != nil {
			return
		}
		// A client of the NodePort whose datagrams the old rules still
		// send to the second socket.
		c, err := net.Dial("udp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(extPort)))
		if err != nil {
			during = err
			return
		}
		defer c.Close()
		if _, err := c.Write([]byte("q")); err != nil {
			during = err
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 64)); err != nil {
			during = err
		}
	}}
	rules := iptables.New(probe, iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.0.2.2")})
	p := newTestProxier(t, Options{NodeName: "node1", IPv4Portals: rules})
	local := makeService("web", withProtocol(v1.ProtocolUDP), withNodePort(30054), func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	es := makeSlice("web", v1.ProtocolUDP, "127.0.0.2:20054", "127.0.0.3:20054")
	es.Endpoints[0].NodeName, es.Endpoints[1].NodeName = ptr.To("node1"), ptr.To("node2")
	p.OnServiceAdd(local)
	p.OnEndpointSliceAdd(es)
	p.Sync()
	ap := p.active[p.lbName("default/web:p")]
	if ap == nil || ap.external == nil {
		t.Fatal("no second socket under externalTrafficPolicy Local")
	}
	extPort = ap.externalPort
	cluster := makeService("web", withProtocol(v1.ProtocolUDP), withNodePort(30054))
	p.OnServiceUpdate(local, cluster)
	p.Sync()
	if during != nil {
		t.Errorf("a client of the second socket (port %d) while the rules moved: %v, want an answer", extPort, during)
	}
	if ap := p.active[p.lbName("default/web:p")]; ap.external != nil {
		t.Fatal("a second socket under externalTrafficPolicy Cluster")
	}
	c, err := net.Dial("udp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(extPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("q"))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 64)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the second socket (port %d) after the sync: %v, want it closed (ECONNREFUSED)", extPort, err)
	}
}

// A rule write that fails leaves the kernel's rules sending the NodePort
// (external IPs, LB IPs) to the retired second socket: it serves on until
// a sync writes them, as README says ("closes it only once the rules send
// its addresses to the service port's socket"). It was closed at the end
// of the failed sync all the same, and its UDP clients were refused until
// the retry wrote the rules. The policy flipped back to Local meanwhile
// opens a second socket of its own, whose balancer the retired one's close
// must not take with it.
func TestRetiredExternalSocketWaitsForAFailedRuleWrite(t *testing.T) {
	startUDPEcho(t, "127.0.0.2:20055", "local:")
	startUDPEcho(t, "127.0.0.3:20055", "remote:")
	fake := iptables.NewFakeRunner(iptables.IPv4)
	rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.0.2.2")})
	p := newTestProxier(t, Options{NodeName: "node1", IPv4Portals: rules})
	local := makeService("web", withProtocol(v1.ProtocolUDP), withNodePort(30055), withClientIPAffinity(60), func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	es := makeSlice("web", v1.ProtocolUDP, "127.0.0.2:20055", "127.0.0.3:20055")
	es.Endpoints[0].NodeName, es.Endpoints[1].NodeName = ptr.To("node1"), ptr.To("node2")
	p.OnServiceAdd(local)
	p.OnEndpointSliceAdd(es)
	p.Sync()
	name := p.lbName("default/web:p")
	ap := p.active[name]
	if ap == nil || ap.external == nil {
		t.Fatal("no second socket under externalTrafficPolicy Local")
	}
	extPort := ap.externalPort
	ask := func(port int) error {
		c, err := net.Dial("udp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = c.Write([]byte("q"))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 64))
		return err
	}

	fake.SetError("Restore", errors.New("iptables-restore: line 3 failed"))
	cluster := makeService("web", withProtocol(v1.ProtocolUDP), withNodePort(30055), withClientIPAffinity(60))
	p.OnServiceUpdate(local, cluster)
	p.Sync()
	if err := ask(extPort); err != nil {
		t.Fatalf("the retired second socket (port %d) after a sync whose rule write failed: %v, want an answer (the kernel's rules still send the NodePort there)", extPort, err)
	}

	// Back to Local before any write succeeded: a new second socket.
	p.OnServiceUpdate(cluster, local)
	p.Sync()
	ap = p.active[name]
	if ap.external == nil || ap.externalPort == extPort {
		t.Fatalf("second socket after the flip back: %v on port %d, want a new one (the retired one holds %d)", ap.external, ap.externalPort, extPort)
	}
	fake.SetError("Restore", nil)
	p.Sync()
	if err := ask(extPort); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the retired second socket (port %d) once the rules were written: %v, want it closed (ECONNREFUSED)", extPort, err)
	}
	if err := ask(ap.externalPort); err != nil {
		t.Errorf("the new second socket (port %d): %v, want an answer from its node-local endpoint", ap.externalPort, err)
	}
	if snap, ok := p.lb.Snapshot(externalName(name)); !ok || !snap.Affinity.ClientIP {
		t.Errorf("the new second socket's balancer entry after the retired one closed: %+v (found %v), want it kept, with ClientIP affinity", snap.Affinity, ok)
	}
}

// A family whose rule write keeps failing (ip6tables-restore) does not
// hold back the close of a retired socket whose rules are all in the
// other: an IPv4 Service's retired second socket closes once IPv4's rules
// are written, or every flip of its policy left one open for as long as
// IPv6's writes failed.
func TestRetiredExternalSocketClosesOnceItsFamilysRulesAreWritten(t *testing.T) {
	startUDPEcho(t, "127.0.0.2:20056", "local:")
	fake4, fake6 := iptables.NewFakeRunner(iptables.IPv4), iptables.NewFakeRunner(iptables.IPv6)
	p := newTestProxier(t, Options{NodeName: "node1",
		IPv4Portals: iptables.New(fake4, iptables.Config{Family: iptables.IPv4, NodeIP: mustAddr("192.0.2.2")}),
		IPv6Portals: iptables.New(fake6, iptables.Config{Family: iptables.IPv6, NodeIP: mustAddr("2001:db8::2")}),
	})
	local := makeService("web", withProtocol(v1.ProtocolUDP), withNodePort(30056), func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	es := makeSlice("web", v1.ProtocolUDP, "127.0.0.2:20056")
	es.Endpoints[0].NodeName = ptr.To("node1")
	p.OnServiceAdd(local)
	p.OnEndpointSliceAdd(es)
	p.Sync()
	ap := p.active[p.lbName("default/web:p")]
	if ap == nil || ap.external == nil {
		t.Fatal("no second socket under externalTrafficPolicy Local")
	}
	extPort := ap.externalPort
	fake6.SetError("Restore", errors.New("ip6tables-restore: line 3 failed"))
	p.OnServiceUpdate(local, makeService("web", withProtocol(v1.ProtocolUDP), withNodePort(30056)))
	// An IPv6 Service, whose rules keep failing.
	p.OnServiceAdd(makeService("six", withProtocol(v1.ProtocolUDP), withClusterIP("fd00::10")))
	p.Sync()
	if ok, _, failed := p.syncPortals(false); ok || len(failed) != 1 {
		t.Fatalf("IPv6's rule write: ok %v, failed %v; want it failing, alone", ok, failed)
	}
	if len(p.retired) != 0 {
		t.Fatalf("%d retired sockets after a sync that wrote IPv4's rules, want none (the Service is IPv4 only; IPv6's write failed)", len(p.retired))
	}
	c, err := net.Dial("udp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(extPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("q"))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 64)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the retired second socket (port %d) once IPv4's rules were written: %v, want it closed (ECONNREFUSED)", extPort, err)
	}
}
