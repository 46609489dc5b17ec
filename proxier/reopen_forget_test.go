package proxier

import (
	"net"
	"net/netip"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// TestFailedReopenForgetsDeletedServicePort: a socket that must reopen (an
// IPv6 cluster IP added: it listens dual-stack) and cannot (another
// process holds the port in IPv6) is unserved and retried; its Service
// deleted before a retry succeeds must take the port's series and
// lifetime with it, as a Service whose port is served does. Before, the
// port was no longer active, so the deletion's sync never closed it and
// its kubeproxy_userspace_* series stayed on /metrics for good.
func TestFailedReopenForgetsDeletedServicePort(t *testing.T) {
	p, _ := newPortalProxier(t)
	failing := false
	p.listen = func(name loadbalancer.ServicePortName, bind netip.Addr, port int, needIPv6 bool, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) (proxySocket, error) {
		if failing {
			return nil, &net.OpError{Op: "listen", Net: "tcp", Err: syscall.EADDRINUSE}
		}
		return newProxySocket(name, bind, port, needIPv6, sp, fp, cfg)
	}
	backends := startBackends(t, "127.0.0.2")
	before := makeService("app", withProtocol(v1.ProtocolTCP))
	p.OnServiceAdd(before)
	p.OnEndpointSliceAdd(makeSlice("app", v1.ProtocolTCP, "127.0.0.2:"+portOf(backends[0].ln.Addr())))
	p.Sync()
	name := loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "app"}, Port: "p", Protocol: v1.ProtocolTCP}
	if p.active[name] == nil {
		t.Fatalf("%v not served: %+v", name, p.DebugServices())
	}
	label := name.String()
	if p.metrics.ports.lookup(label) == nil {
		t.Fatalf("no series for %s while served", label)
	}

	failing = true
	after := makeService("app", withProtocol(v1.ProtocolTCP), func(s *v1.Service) { s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, "fd00::10") })
	p.OnServiceUpdate(before, after)
	p.Sync()
	if p.active[name] != nil {
		t.Fatal("the socket reopened; the test no longer covers a failed reopen")
	}

	p.OnServiceDelete(after)
	p.Sync()
	if m := p.metrics.ports.lookup(label); m != nil {
		t.Errorf("Service deleted while its socket could not reopen: series of %s still exported", label)
	}
	if _, ok := p.sockCfg.lifetimes.ports.Load(name); ok {
		t.Errorf("Service deleted while its socket could not reopen: lifetime of %v still held", name)
	}
}
