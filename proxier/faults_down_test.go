package proxier

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// pingPong sends a line on c and wants the line echo's answer.
func pingPong(c *net.TCPConn) error {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && line != "pong\n" {
		err = errors.New("answer " + line)
	}
	return err
}

// wantCut fails unless c was reset: a read ends with ECONNRESET (a FIN,
// or nothing at all, is not the down's cut).
func wantCut(t *testing.T, what string, c *net.TCPConn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.Copy(io.Discard, c); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("%s: read ended with %v, want it reset by the declared down", what, err)
	}
}

// A down the Service's annotation declares cuts the live connections it
// draws with the fault API off (issue 8: down "refuse[s] new connections
// with RST and cut[s] live ones"), on either data path, and counts each
// in faults_injected_total: at toxicity 0.5 exactly the connections whose
// numbers it draws, which a connection accepted now with that number would
// draw; declared again unchanged beside another toxic, it cuts nothing
// more. Without the fault API those connections drew no fault, so faults
// did not track them, and a kept-alive client went on being served.
func TestFaultDeclaredDownCutsLiveConnections(t *testing.T) {
	const n = 16
	client := mustAddr("127.0.0.1")
	for _, dataPath := range []string{DataPathGoroutines, DataPathEventLoop} {
		t.Run(dataPath, func(t *testing.T) {
			t.Parallel()
			ln := serveTCP(t, "127.0.0.2", lineEcho)
			m := faults.NewMetrics(nil)
			table := faults.NewTable(3, 0, m)
			p := newTestProxier(t, Options{Faults: table, DataPath: dataPath})
			p.OnServiceAdd(makeService("web"))
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, ln.Addr().String()))
			p.Sync()
			addr := proxyAddr(t, p, "default/web:p")
			conns := make([]*net.TCPConn, n)
			for i := range conns {
				conns[i] = dialTCP(t, addr)
				// Answered before the next connects: numbered i.
				if err := pingPong(conns[i]); err != nil {
					t.Fatalf("connection %d: %v", i, err)
				}
			}
			const half = `{"name":"half","type":"down","toxicity":0.5}`
			declared := makeService("web", withFaults(`[`+half+`]`))
			p.OnServiceUpdate(makeService("web"), declared)
			fp := table.Port("default.web.p", "TCP")
			drawn := map[int]bool{}
			for i := range conns {
				if _, ok := fp.DownDrawing(uint64(i), client); ok {
					drawn[i] = true
				}
			}
			if len(drawn) == 0 || len(drawn) == n {
				t.Fatalf("the down drew %d of %d connections: pick another seed", len(drawn), n)
			}
			for i, c := range conns {
				if drawn[i] {
					wantCut(t, fmt.Sprintf("connection %d", i), c)
				}
			}
			// Declared again, unchanged, beside another toxic (a sync
			// parses it again; an edit of another toxic): nothing more.
			p.OnServiceUpdate(declared, makeService("web", withFaults(`[`+half+`,{"name":"nothing","type":"noop"}]`)))
			p.Sync()
			for i, c := range conns {
				if drawn[i] {
					continue
				}
				if err := pingPong(c); err != nil {
					t.Errorf("connection %d did not draw the down but relays no more: %v", i, err)
				}
			}
			if got := testutil.ToFloat64(m.Injected.WithLabelValues("default/web:p", "half", "down", faults.Downstream)); int(got) != len(drawn) {
				t.Errorf("faults_injected_total of the down is %v, want the %d connections it cut", got, len(drawn))
			}
		})
	}
}

// A connection accepted before a down is declared and registered after
// (its backend was still being dialled when the down's cut walked the live
// connections) is cut once it is, and counted once.
func TestFaultDeclaredDownCutsAConnectionStillDialling(t *testing.T) {
	t.Parallel()
	ln := serveTCP(t, "127.0.0.2", lineEcho)
	m := faults.NewMetrics(nil)
	d := &heldDialer{d: backendDialer(relay.Liveness{}), entered: make(chan struct{}, 1), gate: make(chan struct{})}
	p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, m), DataPath: DataPathGoroutines, Dialer: d})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, ln.Addr().String()))
	p.Sync()
	c := dialTCP(t, proxyAddr(t, p, "default/web:p"))
	select {
	case <-d.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy never dialled the backend")
	}
	p.OnServiceUpdate(makeService("web"), makeService("web", withFaults(`[{"name":"down","type":"down"}]`)))
	close(d.gate)
	wantCut(t, "the connection dialling as the down came", c)
	if got := testutil.ToFloat64(m.Injected.WithLabelValues("default/web:p", "down", "down", faults.Downstream)); got != 1 {
		t.Errorf("faults_injected_total of the down is %v, want 1", got)
	}
}

// heldDialer tells entered of each dial and holds it until gate closes.
type heldDialer struct {
	d       Dialer
	entered chan struct{}
	gate    chan struct{}
}

func (h *heldDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-h.gate
	// The attempt's own bound is the dial's, not the gate's (gatedDialer).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return h.d.DialContext(ctx, network, address)
}

// The event loops' twin of TestFaultDeclaredDownCutsAConnectionStillDialling,
// whose held Dialer the loops do not use: the endpoint's accept queue is
// full, so the loop's SYN goes unanswered until the down is declared and a
// place is made; the connection reaches the registry only then, after the
// down's cut walked it, and is cut (and counted once) as it connects.
func TestFaultDeclaredDownCutsALoopConnectionStillDialling(t *testing.T) {
	t.Parallel()
	port := portOf(serveTCP(t, "127.0.0.2", lineEcho).Addr()) // a free port
	// Its accept queue full, the endpoint drops SYNs (sent again at 1 s,
	// 3 s...) until the one connection queued is taken.
	full := silentListener(t, "127.0.0.9", port)
	m := faults.NewMetrics(nil)
	p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, m), DataPath: DataPathEventLoop,
		DialTimeouts: []time.Duration{30 * time.Second}})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "127.0.0.9:"+port))
	p.Sync()
	sock := p.active[p.lbName("default/web:p")].socket.(*tcpProxySocket)
	c := dialTCP(t, proxyAddr(t, p, "default/web:p"))
	waitHeld(t, sock.held.Load, 1) // accepted: its dial is under way
	p.OnServiceUpdate(makeService("web"), makeService("web", withFaults(`[{"name":"down","type":"down"}]`)))
	nfd, _, err := unix.Accept(full) // the loop's next SYN is answered
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(nfd)
	wantCut(t, "the loop connection dialling as the down came", c)
	if got := testutil.ToFloat64(m.Injected.WithLabelValues("default/web:p", "down", "down", faults.Downstream)); got != 1 {
		t.Errorf("faults_injected_total of the down is %v, want 1", got)
	}
}

// A connection a declared down cut stays in the registry until its relay
// ends; a second down declared meanwhile that draws it too neither resets
// it again nor counts it: each down's count is of the connections it cut.
func TestDeclaredDownsCountAConnectionOnce(t *testing.T) {
	m := faults.NewMetrics(nil)
	port := faults.NewTable(0, 0, m).PortLabeled("default.web.p", "TCP", "default/web:p")
	reg := &connRegistry{}
	c := &liveConn{reg: reg, client: netip.MustParseAddrPort("10.0.0.1:40000"), untracked: port, seq: 0}
	reg.tcp.Store(c, struct{}{})
	down := func(name string) faults.Toxic {
		return faults.Toxic{Name: name, Type: "down", Stream: faults.Downstream, Toxicity: 1}
	}
	reg.cutDowns(port.SetDeclared([]faults.Toxic{down("first")}))
	reg.cutDowns(port.SetDeclared([]faults.Toxic{down("first"), down("second")}))
	for name, want := range map[string]float64{"first": 1, "second": 0} {
		if got := testutil.ToFloat64(m.Injected.WithLabelValues("default/web:p", name, "down", faults.Downstream)); got != want {
			t.Errorf("faults_injected_total of the down %s is %v, want %v", name, got, want)
		}
	}
}
