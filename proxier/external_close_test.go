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
