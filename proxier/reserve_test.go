package proxier

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
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

// firstRead connects to addr and reads a byte: the error a refused client
// sees (a reset), or nil once served.
func firstRead(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	return err
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
			if err := firstRead(addr); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client in the reserve: %v, want a reset", err)
			}
			if got := failedConnections(t, p); got != 1 {
				t.Fatalf("connections_failed_total %v, want 1", got)
			}

			setDescriptorCeiling()
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
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

// With a real limit of 256 descriptors, idle clients held until the
// proxy refuses them leave its health server able to answer. The proxy
// runs in a child process (the limit is the process's), the clients and
// the backend here: their descriptors must not count against the proxy's.
// Before, the connections took every descriptor and /healthz could not
// accept.
func TestIdleClientsLeaveHealthzDescriptors(t *testing.T) {
	if testing.Short() {
		t.Skip("holds hundreds of connections")
	}
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) {
			backend := echoBackends(t, "127.0.0.2")[0]
			cmd := exec.Command(os.Args[0], "-test.run=^TestReserveChild$", "-test.v")
			cmd.Env = append(os.Environ(), "KUP_RESERVE_CHILD="+path+","+backend)
			stdin, _ := cmd.StdinPipe() // the child lives until it closes
			out, _ := cmd.StdoutPipe()
			cmd.Stderr = io.Discard
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { stdin.Close(); _ = cmd.Wait() }()
			var proxy, health string
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if _, err := fmt.Sscanf(sc.Text(), "ADDRS %s %s", &proxy, &health); err == nil {
					break
				}
			}
			go func() { _, _ = io.Copy(io.Discard, out) }()
			if proxy == "" {
				t.Fatal("the child never said where it listens")
			}

			served, refused := 0, 0
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for range 200 {
				c, err := net.DialTimeout("tcp", proxy, 2*time.Second)
				if err == nil {
					held = append(held, c)
					_ = c.SetDeadline(time.Now().Add(2 * time.Second))
					if _, err = c.Write([]byte("x")); err == nil {
						_, err = io.ReadFull(c, make([]byte, 1))
					}
				}
				if err == nil {
					served++
				} else {
					refused++
				}
			}
			if served == 0 || refused == 0 {
				t.Fatalf("%d clients served, %d refused; want the limit reached", served, refused)
			}
			t.Logf("%d clients served, %d refused", served, refused)
			// The proxy's own work needs several descriptors at once (a rule
			// write's pipes, a scrape beside a probe): eight health clients
			// held open together. Before, a refused client freed only its
			// own descriptor, and the second of them hung.
			for i := range 8 {
				c, err := net.DialTimeout("tcp", health, 2*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, c)
				_ = c.SetDeadline(time.Now().Add(3 * time.Second))
				if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil || !strings.Contains(line, "200") {
					t.Fatalf("/healthz client %d with %d idle clients held: %q, %v", i+1, served, line, err)
				}
			}
		})
	}
}

// TestReserveChild is TestIdleClientsLeaveHealthzDescriptors' proxy.
func TestReserveChild(t *testing.T) {
	arg := os.Getenv("KUP_RESERVE_CHILD")
	if arg == "" {
		t.Skip("run by TestIdleClientsLeaveHealthzDescriptors")
	}
	path, backend, _ := strings.Cut(arg, ",")
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	r.Cur = 256
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	go func() { _ = http.Serve(hl, mux) }()
	// No per-port share (tcp_share.go): the ceiling is what refuses.
	p := newTestProxier(t, Options{DataPath: path, TCPMaxConnectionsPerPort: -1})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend))
	p.Sync()
	fmt.Printf("ADDRS %s %s\n", proxyAddr(t, p, "default/web:p"), hl.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// A faulted client in the reserve is refused at once, not after its
// connect_delay: the delay held a reserved descriptor all that time.
func TestFaultedClientInReserveRefusedBeforeConnectDelay(t *testing.T) {
	ln := serveTCP(t, "127.0.0.2", func(c net.Conn) { c.Close() })
	addr := faultedProxies(t, 0, v1.ProtocolTCP, ln.Addr().String(),
		`[{"type":"connect_delay","attributes":{"delay":3000}}]`)[0]
	lowCeiling(t, 1)
	start := time.Now()
	if err := firstRead(addr); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("faulted client in the reserve: %v, want a reset", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("refused after %v: the 3 s connect_delay ran first", took.Round(time.Millisecond))
	}
}
