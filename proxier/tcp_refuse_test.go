package proxier

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
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

// No other socket can take a down port, SO_REUSEADDR or not (net.Listen
// sets it), on either data path, and the port serves again when it comes
// up. Before, any local user's SO_REUSEADDR socket could bind the down
// port and listen on it: the port's listen failed when it came up, and the
// Service's clients reached that socket.
func TestDownPortCannotBeTaken(t *testing.T) {
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) {
			_, table, addr := faultedWeb(t, path)
			const proxy = "default.web.p"
			dialExchange(t, addr).Close() // a connection in TIME_WAIT or open on the port
			if _, err := table.SetEnabled(proxy, false); err != nil {
				t.Fatal(err)
			}
			_, port, _ := net.SplitHostPort(addr)
			for _, at := range []string{addr, ":" + port} {
				if squatter, err := net.Listen("tcp", at); !errors.Is(err, syscall.EADDRINUSE) {
					if err == nil {
						squatter.Close()
					}
					t.Fatalf("listen on %s while the port is down: %v, want EADDRINUSE", at, err)
				}
			}
			if _, err := table.SetEnabled(proxy, true); err != nil {
				t.Fatal(err)
			}
			dialExchange(t, addr)
		})
	}
}

// A port whose socket cannot listen again when the fault API enables it
// (another socket listens on its port: one that bound it in the instant
// relay.ListenAgain leaves open) is not reported served: the API's
// SetEnabled fails (ErrNotServing, the API's 503), the port stays up, a
// sync counts it in service_ports_unserved and shows the error in
// /debug/services, and the socket's own retry or the sync's listens once
// the port is free. Before, SetEnabled succeeded (the API answered
// "enabled":true), and metrics and /debug showed the port served.
func TestDownPortNotListeningAgainIsUnserved(t *testing.T) {
	defer relistenRetry.Store(relistenRetry.Swap(int64(20 * time.Millisecond)))
	taken := error(&net.OpError{Op: "listen", Net: "tcp", Err: syscall.EADDRINUSE})
	for _, path := range DataPaths {
		for _, takenBack := range []string{"retry", "sync"} {
			t.Run(path+"/"+takenBack, func(t *testing.T) {
				if takenBack == "sync" {
					defer relistenRetry.Store(relistenRetry.Swap(int64(time.Hour)))
				}
				p, table, addr := faultedWeb(t, path)
				const proxy = "default.web.p"
				if _, err := table.SetEnabled(proxy, false); err != nil {
					t.Fatal(err)
				}
				relistenFault.Store(&taken)
				defer relistenFault.Store(nil)
				info, err := table.SetEnabled(proxy, true)
				if !errors.Is(err, faults.ErrNotServing) || !errors.Is(err, syscall.EADDRINUSE) {
					t.Fatalf("enabling a port whose socket cannot listen: %v, want ErrNotServing with EADDRINUSE", err)
				}
				if !info.Enabled {
					t.Fatal("the port shows down: its socket retries to serve it enabled")
				}
				wantRefused(t, addr, "not listening again")
				p.Sync()
				if got := testutil.ToFloat64(p.metrics.ServicePortsUnserved); got != 1 {
					t.Fatalf("service_ports_unserved = %v, want 1", got)
				}
				if row := debugRowOf(t, p, "default/web:p"); !strings.Contains(row.Error, "cannot listen again") {
					t.Fatalf("/debug/services error = %q, want why the socket does not listen", row.Error)
				}
				relistenFault.Store(nil)
				if takenBack == "sync" {
					p.Sync()
				}
				deadline := time.Now().Add(5 * time.Second)
				for {
					c, err := net.DialTimeout("tcp", addr, time.Second)
					if err == nil {
						c.Close()
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the port did not listen again once free: %v", err)
					}
					time.Sleep(20 * time.Millisecond)
				}
				dialExchange(t, addr)
				p.Sync()
				if got := testutil.ToFloat64(p.metrics.ServicePortsUnserved); got != 0 {
					t.Fatalf("service_ports_unserved = %v after the socket listens again, want 0", got)
				}
				if row := debugRowOf(t, p, "default/web:p"); row.Error != "" {
					t.Fatalf("/debug/services error = %q after the socket listens again", row.Error)
				}
			})
		}
	}
}

func debugRowOf(t *testing.T, p *Proxier, key string) DebugServicePort {
	t.Helper()
	for _, r := range p.DebugServices() {
		if r.ServicePort == key {
			return r
		}
	}
	t.Fatalf("no /debug/services row %s", key)
	return DebugServicePort{}
}

// A down UDP port keeps its socket bound and open (its datagrams are
// dropped), without SO_REUSEADDR: no other socket can bind it, with
// SO_REUSEADDR or without.
func TestDownUDPPortCannotBeTaken(t *testing.T) {
	echo := loopbackUDPEcho(t)
	table := faults.NewTable(0, 0, nil)
	p := newTestProxier(t, Options{Faults: table})
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, echo.LocalAddr().String()))
	p.Sync()
	addr := proxyAddr(t, p, "default/dns:p")
	if _, err := table.SetEnabled("default.dns.p", false); err != nil {
		t.Fatal(err)
	}
	reuseAddr := net.ListenConfig{Control: func(_, _ string, raw syscall.RawConn) error {
		var serr error
		err := raw.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
		})
		return errors.Join(err, serr)
	}}
	for _, lc := range []net.ListenConfig{{}, reuseAddr} {
		if c, err := lc.ListenPacket(context.Background(), "udp", addr); !errors.Is(err, syscall.EADDRINUSE) {
			if err == nil {
				c.Close()
			}
			t.Fatalf("UDP bind to %s while the port is down: %v, want EADDRINUSE", addr, err)
		}
	}
}

// An enable that could not listen answers 503 (ErrNotServing);
// a client that retries the same enable (or calls /reset) while the socket
// still cannot listen gets that error again: the port was already
// "enabled", so no watcher was told, and the retry answered success.
func TestRepeatedEnableOfANotListeningPortAnswersItsError(t *testing.T) {
	defer relistenRetry.Store(relistenRetry.Swap(int64(time.Hour)))
	taken := error(&net.OpError{Op: "listen", Net: "tcp", Err: syscall.EADDRINUSE})
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) {
			_, table, addr := faultedWeb(t, path)
			const proxy = "default.web.p"
			if _, err := table.SetEnabled(proxy, false); err != nil {
				t.Fatal(err)
			}
			relistenFault.Store(&taken)
			defer relistenFault.Store(nil)
			if _, err := table.SetEnabled(proxy, true); !errors.Is(err, faults.ErrNotServing) {
				t.Fatalf("first enable: %v", err)
			}
			_, err := table.SetEnabled(proxy, true)
			rerr := table.Reset()
			wantRefused(t, addr, "still not listening")
			if !errors.Is(err, faults.ErrNotServing) {
				t.Errorf("a second enable while the socket still cannot listen: err %v (API 200 \"enabled\":true), want ErrNotServing (503)", err)
			}
			if !errors.Is(rerr, faults.ErrNotServing) {
				t.Errorf("/reset while the socket cannot listen: err %v (API 204), want ErrNotServing (503)", rerr)
			}
		})
	}
}
