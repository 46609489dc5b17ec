package harness

import (
	"net/netip"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// ServeBackend runs a backend.Server named name on addr, TCP and UDP, inside
// ns, from the test process itself: unlike a backend process, a test can stop
// it gracefully (Close) the way a terminating pod stops, and count its
// answers. It is closed when t ends.
func ServeBackend(t testing.TB, ns *netns.NS, name string, addr netip.AddrPort) *backend.Server {
	t.Helper()
	tcp, err := ns.ListenTCP(addr)
	if err != nil {
		t.Fatalf("backend %s: %v", name, err)
	}
	udp, err := ns.ListenUDPAt(addr)
	if err != nil {
		tcp.Close()
		t.Fatalf("backend %s: %v", name, err)
	}
	// No logging: errors after the test has ended must not reach t.Logf.
	s := backend.Serve(name, backend.Ask, tcp, udp, nil)
	t.Cleanup(s.Close)
	return s
}
