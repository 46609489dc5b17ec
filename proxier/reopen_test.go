package proxier

import (
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// TestReopenKeepsServicePort: a change that must reopen a service port's
// socket (an unnamed port's new number renames its fault port; an IPv6
// address needs a dual-stack socket) keeps the service port: same
// ServicePortName, same protocol. Its ClientIP affinity pins survive, and
// the new sockets listen on the old proxy ports, so the portals of the
// addresses that did not change are not rewritten; only when another
// process took the port meanwhile does the socket move. Before, the port
// was closed and opened anew: its balancer entry was deleted (pins lost)
// and every portal moved to a new proxy port.
func TestReopenKeepsServicePort(t *testing.T) {
	const node = "node-1"
	unnamed := func(port int32) svcOpt {
		return func(s *v1.Service) { s.Spec.Ports[0].Name, s.Spec.Ports[0].Port = "", port }
	}
	withIPv6ClusterIP := func(s *v1.Service) { s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, "fd00::10") }
	local := func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }
	withExternalIP := func(ip string) svcOpt {
		return func(s *v1.Service) { s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, ip) }
	}
	for _, tc := range []struct {
		name          string
		proto         v1.Protocol
		portName      string
		before, after []svcOpt
		// sameRules: the (IPv4) portals are not rewritten at all.
		sameRules bool
		// portTaken: another process holds the old proxy port when the
		// socket reopens.
		portTaken bool
		// split: an external socket serves the Local policy.
		split bool
	}{
		{name: "unnamed TCP port's number changed", proto: v1.ProtocolTCP,
			before: []svcOpt{unnamed(80)}, after: []svcOpt{unnamed(81)}},
		{name: "unnamed UDP port's number changed", proto: v1.ProtocolUDP,
			before: []svcOpt{unnamed(53)}, after: []svcOpt{unnamed(54)}},
		{name: "IPv6 cluster IP added", proto: v1.ProtocolTCP, portName: "p",
			after: []svcOpt{withIPv6ClusterIP}, sameRules: true},
		{name: "IPv6 cluster IP and external IP added to a Local NodePort", proto: v1.ProtocolUDP, portName: "p",
			before: []svcOpt{withNodePort(30053), local},
			after:  []svcOpt{withNodePort(30053), local, withIPv6ClusterIP, withExternalIP("fd00::20")}, sameRules: true, split: true},
		{name: "old proxy port taken meanwhile", proto: v1.ProtocolTCP,
			before: []svcOpt{unnamed(80)}, after: []svcOpt{unnamed(81)}, portTaken: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, fake := newPortalProxier(t)
			p.opts.NodeName = node
			p.SetNodeZone("")
			taken := 0
			p.listen = func(name loadbalancer.ServicePortName, bind netip.Addr, port int, needIPv6 bool, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) (proxySocket, error) {
				if port != 0 && port == taken {
					return nil, &net.OpError{Op: "listen", Net: "tcp", Err: syscall.EADDRINUSE}
				}
				return newProxySocket(name, bind, port, needIPv6, sp, fp, cfg)
			}
			svc := func(opts []svcOpt) *v1.Service {
				return makeService("app", append([]svcOpt{withProtocol(tc.proto), withClientIPAffinity(600)}, opts...)...)
			}
			backends := startBackends(t, "127.0.0.2", "127.0.0.3")
			port := portOf(backends[0].ln.Addr())
			es := makeSlice("app", tc.proto, "127.0.0.2:"+port, "127.0.0.3:"+port)
			es.Ports[0].Name = ptr.To(tc.portName)
			for i := range es.Endpoints {
				es.Endpoints[i].NodeName = ptr.To(node)
			}
			before := svc(tc.before)
			p.OnServiceAdd(before)
			p.OnEndpointSliceAdd(es)
			p.Sync()

			name := loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "app"}, Port: tc.portName, Protocol: tc.proto}
			ap := p.active[name]
			if ap == nil {
				t.Fatalf("%v not served: %+v", name, p.DebugServices())
			}
			oldSocket, oldPort, oldExternal, externalPort := ap.socket, ap.proxyPort, ap.external, ap.externalPort
			split := ap.external != nil
			if split != tc.split {
				t.Fatalf("external socket open: %v, want %v", split, tc.split)
			}
			client := netip.MustParseAddr("127.0.0.5")
			pins := map[loadbalancer.ServicePortName]netip.AddrPort{}
			for _, n := range []loadbalancer.ServicePortName{name, externalName(name)} {
				if n != name && !split {
					continue
				}
				ep, err := p.lb.ServicePort(n).Next(client, false)
				if err != nil {
					t.Fatalf("%v: %v", n, err)
				}
				pins[n] = ep
			}
			rules := natRules(fake)
			if tc.portTaken {
				taken = oldPort
			}

			p.OnServiceUpdate(before, svc(tc.after))
			p.Sync()
			ap = p.active[name]
			if ap == nil {
				t.Fatalf("%v not served after the change: %+v", name, p.DebugServices())
			}
			if ap.socket == oldSocket || (split && ap.external == oldExternal) {
				t.Fatal("the change did not reopen the socket; the test no longer covers the reopen")
			}
			switch {
			case tc.portTaken && (ap.proxyPort == oldPort || ap.proxyPort == 0):
				t.Errorf("reopened on port %d, which another process holds", ap.proxyPort)
			case !tc.portTaken && ap.proxyPort != oldPort:
				t.Errorf("proxy port moved from %d to %d", oldPort, ap.proxyPort)
			}
			if split && ap.externalPort != externalPort {
				t.Errorf("external proxy port moved from %d to %d", externalPort, ap.externalPort)
			}
			if got := natRules(fake); tc.sameRules && got != rules {
				t.Errorf("portals rewritten:\n%s\nwant\n%s", got, rules)
			}
			for n, pinned := range pins {
				snap, ok := p.lb.Snapshot(n)
				if !ok {
					t.Errorf("%v: balancer entry gone", n)
					continue
				}
				if len(snap.Clients) != 1 || snap.Clients[0].ClientIP != client || snap.Clients[0].Endpoint != pinned {
					t.Errorf("%v: affinity %+v after the reopen, want %v pinned to %v", n, snap.Clients, client, pinned)
				}
			}
			if tc.proto == v1.ProtocolTCP {
				// The reopened socket serves, and the pinned backend answers.
				want := ""
				for _, b := range backends {
					if b.ln.Addr().String() == pins[name].String() {
						want = b.name
					}
				}
				got, err := askName(t, client.String(), net.JoinHostPort("127.0.0.1", strconv.Itoa(ap.proxyPort)))
				if err != nil || got != want {
					t.Errorf("through the reopened socket: %q, %v; want %q", got, err, want)
				}
			}
		})
	}
}
