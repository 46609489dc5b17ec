package proxier

import (
	"net"
	"testing"
	"time"
)

// A port the fault API sets down refuses connects (ECONNREFUSED, as
// Toxiproxy's disabled proxy and a closed port) on both data paths, cuts
// its live connections, and serves on the same port when it comes up
// again, by enabled:true or by /reset. Before, a client's connect
// succeeded and its first read was reset.
func TestDownPortRefusesConnects(t *testing.T) {
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) {
			p, table, addr := faultedWeb(t, path)
			const proxy = "default.web.p"
			for round, up := range []func() error{
				func() error { _, err := table.SetEnabled(proxy, true); return err },
				func() error { table.Reset(); return nil },
			} {
				live := dialExchange(t, addr)
				if _, err := table.SetEnabled(proxy, false); err != nil {
					t.Fatal(err)
				}
				wantRefused(t, addr, "port down")
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
			wantRefused(t, addr, "port opened down")
			if _, err := table.SetEnabled(proxy, true); err != nil {
				t.Fatal(err)
			}
			dialExchange(t, addr)
		})
	}
}

// A port that cannot listen again when it comes up (another socket took it
// while it was down, which SO_REUSEADDR allows) keeps trying, and serves
// once that socket lets go. Before, it stayed refusing until reopened.
func TestDownPortListensAgainOnceThePortIsFree(t *testing.T) {
	defer relistenRetry.Store(relistenRetry.Swap(int64(20 * time.Millisecond)))
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) {
			_, table, addr := faultedWeb(t, path)
			const proxy = "default.web.p"
			if _, err := table.SetEnabled(proxy, false); err != nil {
				t.Fatal(err)
			}
			squatter, err := net.Listen("tcp", addr)
			if err != nil {
				t.Skipf("the refusing port could not be taken (%v): nothing to test", err)
			}
			if _, err := table.SetEnabled(proxy, true); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // retries fail meanwhile
			squatter.Close()
			deadline := time.Now().Add(5 * time.Second)
			for {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err == nil {
					c.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the port did not listen again after the other socket let go: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			dialExchange(t, addr)
		})
	}
}
