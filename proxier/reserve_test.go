package proxier

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// lowCeiling puts the descriptor ceiling (relay.SetDescriptorCeiling) at n
// for the test, after New set it from the limit. Not parallel: the
// ceiling is the process's.
func lowCeiling(t *testing.T, n int) {
	t.Helper()
	relay.SetDescriptorCeiling(n)
	t.Cleanup(setDescriptorCeiling)
}

// failedConnections is the sum of connections_failed_total.
func failedConnections(t *testing.T, p *Proxier) float64 {
	t.Helper()
	mfs, err := p.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "kubeproxy_userspace_connections_failed_total" {
			for _, m := range mf.Metric {
				sum += counterValue(m)
			}
		}
	}
	return sum
}

func counterValue(m *dto.Metric) float64 { return m.GetCounter().GetValue() }

// A TCP client whose socket (or backend socket) falls in the descriptor
// reserve is refused at once with a reset and counted as failed, on both
// data paths; below the ceiling it is served. Before, connections took
// descriptors up to the limit: with 10,000 Services under a limit of
// 20,000, 1,492 idle clients left /healthz unable to accept and every rule
// write failing, and new clients hung in the backlog.
func TestTCPClientInReserveRefused(t *testing.T) {
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) {
			backend := echoBackends(t, "127.0.0.2")[0]
			p := newTestProxier(t, Options{DataPath: path})
			p.OnServiceAdd(makeService("web"))
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend))
			p.Sync()
			addr := proxyAddr(t, p, "default/web:p")

			lowCeiling(t, 1)
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err == nil {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err = c.Read(make([]byte, 1))
				c.Close()
			}
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client in the reserve: %v, want a reset", err)
			}
			if got := failedConnections(t, p); got != 1 {
				t.Fatalf("connections_failed_total %v, want 1", got)
			}

			setDescriptorCeiling()
			c, err = net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write([]byte("hi")); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 2)
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "hi" {
				t.Fatalf("below the ceiling: read %q, %v", got, err)
			}
		})
	}
}

// A UDP session whose backend socket falls in the reserve is not opened:
// the datagram is dropped and counted as failed, no endpoint blamed.
func TestUDPSessionInReserveRefused(t *testing.T) {
	echo := startUDPEcho(t, "127.0.0.2:0", "a:")
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP)))
	p.OnEndpointSliceAdd(makeSlice("dns", v1.ProtocolUDP, echo.LocalAddr().String()))
	p.Sync()
	proxy := netip.MustParseAddrPort(proxyAddr(t, p, "default/dns:p"))
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(proxy))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ask := func() error {
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 16)
		n, err := c.Read(buf)
		if err == nil && string(buf[:n]) != "a:x" {
			t.Fatalf("reply %q", buf[:n])
		}
		return err
	}

	lowCeiling(t, 1)
	if err := ask(); err == nil {
		t.Fatal("a session opened in the descriptor reserve")
	}
	if got := failedConnections(t, p); got != 1 {
		t.Fatalf("connections_failed_total %v, want 1", got)
	}
	if _, err := dialUDPBackend(netip.MustParseAddrPort(echo.LocalAddr().String())); !errors.Is(err, relay.ErrDescriptorReserve) {
		t.Fatalf("dialUDPBackend in the reserve: %v", err)
	}
	if m := p.metrics.ports.forPort("default/dns:p", true); m.dialFailures.value() != 0 {
		t.Fatalf("dial failures %v: an endpoint was blamed", m.dialFailures.value())
	}

	setDescriptorCeiling()
	if err := ask(); err != nil {
		t.Fatalf("below the ceiling: %v", err)
	}
}
