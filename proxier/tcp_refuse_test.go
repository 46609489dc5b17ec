package proxier

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// A port the fault API sets down refuses connects (ECONNREFUSED, as
// Toxiproxy's disabled proxy and a closed port) on both data paths, cuts
// its live connections, and serves on the same port when it comes up
// again, by enabled:true or by /reset. Before, a client's connect
// succeeded and its first read was reset.
func TestDownPortRefusesConnects(t *testing.T) {
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) {
			backend := echoBackends(t, "127.0.0.2")[0]
			table := faults.NewTable(0, 0, nil)
			table.TrackLive = true
			p := newTestProxier(t, Options{DataPath: path, Faults: table})
			p.OnServiceAdd(makeService("web"))
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend))
			p.Sync()
			addr := proxyAddr(t, p, "default/web:p")
			const proxy = "default.web.p"
			refused := func(when string) {
				t.Helper()
				c, err := net.DialTimeout("tcp", addr, 2*time.Second)
				if err == nil {
					c.Close()
					t.Fatalf("%s: connect succeeded, want it refused", when)
				}
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Fatalf("%s: connect: %v, want ECONNREFUSED", when, err)
				}
			}
			for round, up := range []func() error{
				func() error { _, err := table.SetEnabled(proxy, true); return err },
				func() error { table.Reset(); return nil },
			} {
				live := dialExchange(t, addr)
				if _, err := table.SetEnabled(proxy, false); err != nil {
					t.Fatal(err)
				}
				refused("down")
				_ = live.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := live.Read(make([]byte, 1)); !isConnReset(err) {
					t.Fatalf("round %d: live connection after down: %v, want a reset", round, err)
				}
				if err := up(); err != nil {
					t.Fatal(err)
				}
				if got := proxyAddr(t, p, "default/web:p"); got != addr {
					t.Fatalf("round %d: the proxy port moved from %s to %s", round, addr, got)
				}
				dialExchange(t, addr)
			}
			// A port opened while its fault port is down starts refusing.
			if _, err := table.SetEnabled(proxy, false); err != nil {
				t.Fatal(err)
			}
			p.OnServiceDelete(makeService("web"))
			p.Sync()
			table.Port(proxy, "TCP") // as when the API names a port before its Service
			if _, err := table.SetEnabled(proxy, false); err != nil {
				t.Fatal(err)
			}
			p.OnServiceAdd(makeService("web"))
			p.Sync()
			addr = proxyAddr(t, p, "default/web:p")
			refused("opened down")
			if _, err := table.SetEnabled(proxy, true); err != nil {
				t.Fatal(err)
			}
			dialExchange(t, addr)
		})
	}
}
