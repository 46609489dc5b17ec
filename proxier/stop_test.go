package proxier

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// stopWatcher is iptables.Rules that notes, when told to stop, whether the
// proxy socket at addr still listened then.
type stopWatcher struct {
	*iptables.Rules
	addr      string
	stopped   bool
	listening bool
	dialErr   error
}

func (s *stopWatcher) Stop() error {
	s.stopped = true
	// A port without endpoints may reset the client at once: anything but
	// ECONNREFUSED means a socket held the port.
	c, err := net.Dial("tcp", s.addr)
	if err == nil {
		c.Close()
	}
	s.dialErr = err
	s.listening = !errors.Is(err, syscall.ECONNREFUSED)
	return s.Rules.Stop()
}

// A proxy that stops flushes the accepts of portal traffic before it closes
// its sockets, so no moment passes in which a portal's traffic is accepted
// into a port nobody of ours holds; the portals themselves stay.
func TestRunFlushesTheAcceptsBeforeClosingSockets(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	w := &stopWatcher{Rules: iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), NodeIP: mustAddr("127.0.0.1")})}
	p := New(Options{IPv4Portals: w, BindAddress: mustAddr("127.0.0.1")})
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.OnServiceAdd(makeService("web", withNodePort(30080)))
	p.Sync()
	w.addr = proxyAddr(t, p, "default/web:p")
	if len(fake.Rules(iptables.TableFilter, iptables.ChainPortalsNonLocal)) == 0 {
		t.Fatalf("no accept of portal traffic after the sync")
	}
	nat := natRules(fake)
	stopNow(p)
	if !w.stopped || !w.listening {
		t.Errorf("Stop called: %v; the proxy socket still listened then: %v (want both): %v", w.stopped, w.listening, w.dialErr)
	}
	for _, c := range []string{iptables.ChainPortalsNonLocal, iptables.ChainNodePortNonLocal} {
		if got := fake.Rules(iptables.TableFilter, c); len(got) != 0 {
			t.Errorf("after the proxy stopped %s holds %q, want nothing", c, got)
		}
	}
	if got := natRules(fake); got != nat {
		t.Errorf("the stop changed the portals:\n got %s\nwant %s", got, nat)
	}
}

// While another proxy programs this namespace's rules (an overlapping
// restart), a stopping one leaves the accepts of portal traffic in place:
// the other's last sync may have written the portals, naming its own
// ports, whose traffic the accepts let in. Flushed, every Service of the
// proxy that stays was refused until it repaired the rules.
func TestStopLeavesTheAcceptsToAnotherProxy(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	w := &stopWatcher{Rules: iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), NodeIP: mustAddr("127.0.0.1")})}
	p := New(Options{IPv4Portals: w, BindAddress: mustAddr("127.0.0.1"), OtherProxyRunning: func() bool { return true }})
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.OnServiceAdd(makeService("web", withNodePort(30080)))
	p.Sync()
	w.addr = proxyAddr(t, p, "default/web:p")
	before := fake.Rules(iptables.TableFilter, iptables.ChainPortalsNonLocal)
	stopNow(p)
	if w.stopped {
		t.Errorf("Stop called while another proxy runs")
	}
	if got := fake.Rules(iptables.TableFilter, iptables.ChainPortalsNonLocal); len(got) == 0 || len(got) != len(before) {
		t.Errorf("after the proxy stopped %s holds %q, want %q", iptables.ChainPortalsNonLocal, got, before)
	}
}

// A proxy that stops clears the entries of its UDP service ports' flows: a
// client that keeps its source port (a resolver, statsd) kept an entry
// NATed to the proxy port, which no accept guards once the stop flushed
// them, so its datagrams reached whoever bound the port next and that
// process's answers reached it as the service address. While another
// proxy runs, which keeps the accepts, nothing is cleared.
func TestStopClearsUDPFlows(t *testing.T) {
	for _, other := range []bool{false, true} {
		fake := iptables.NewFakeRunner(iptables.IPv4)
		rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), NodeIP: mustAddr("127.0.0.1")})
		ct := &fakeConntrack{}
		p := New(Options{IPv4Portals: rules, BindAddress: mustAddr("127.0.0.1"), Conntrack: ct,
			OtherProxyRunning: func() bool { return other }})
		p.OnServiceSynced()
		p.OnEndpointSlicesSynced()
		p.OnServiceAdd(makeService("dns", withProtocol(v1.ProtocolUDP), withClusterIP("10.96.0.10")))
		p.OnServiceAdd(makeService("web", withClusterIP("10.96.0.11")))
		p.Sync()
		ct.take()
		stopNow(p)
		got := ct.take()
		switch want := "udp 10.96.0.10:80"; {
		case !other && !slices.Contains(got, want):
			t.Errorf("after the stop cleared %q, want %s among them", got, want)
		case other && len(got) > 0:
			t.Errorf("another proxy runs: cleared %q, want nothing", got)
		case slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "tcp ") }):
			t.Errorf("cleared TCP entries %q: connections are the sockets' own", got)
		}
	}
}

// releasedDialer dials only once released, as an endpoint slow to answer
// the SYN; entered tells a dial began.
type releasedDialer struct{ entered, release chan struct{} }

func (d releasedDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.entered <- struct{}{}
	<-d.release
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

// A connection the stop finds before its backend answered (dialling, or
// waiting out a connect_delay toxic: faulted connections take goroutines
// on the event loops too) is reset like a relayed one (DESIGN: the
// proxy's own stop reaches the peers as a reset), and its goroutine does
// not go on to relay once the dial completes. Registered only once its
// backend answered, it was out of the stop's reach: its client stayed open
// (a FIN at the process's exit), and a dial that completed after the stop
// relayed.
func TestStopResetsConnectionsNotYetRelayed(t *testing.T) {
	for _, tc := range []struct {
		name string
		// dialer: the dial blocks until released (goroutine relay);
		// else a connect_delay toxic holds the connection.
		dialer bool
	}{
		{"dialling", true},
		{"in a connect_delay", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.2:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := ln.Accept(); err == nil {
					accepted <- c
				}
			}()
			d := releasedDialer{entered: make(chan struct{}, 1), release: make(chan struct{})}
			opts := Options{BindAddress: mustAddr("127.0.0.1"), Faults: faults.NewTable(0, 0, nil)}
			svc := makeService("web")
			if tc.dialer {
				opts.DataPath, opts.Dialer = DataPathGoroutines, d
			} else {
				opts.DataPath = os.Getenv("KUP_TEST_DATA_PATH")
				svc = makeService("web", withFaults(`[{"type":"connect_delay","attributes":{"delay":5000}}]`))
			}
			p := New(opts)
			p.OnServiceSynced()
			p.OnEndpointSlicesSynced()
			p.OnServiceAdd(svc)
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, ln.Addr().String()))
			p.Sync()
			c, err := net.Dial("tcp", proxyAddr(t, p, "default/web:p"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.dialer {
				<-d.entered
			} else {
				time.Sleep(200 * time.Millisecond) // in the delay
			}
			stopNow(p)
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("client read after the proxy's stop: %v; want a reset", err)
			}
			close(d.release)
			select {
			case b := <-accepted:
				defer b.Close()
				if !tc.dialer {
					t.Fatalf("the backend got a connection after the stop, the connect_delay cut short")
				}
				_ = b.SetReadDeadline(time.Now().Add(3 * time.Second))
				if _, err := b.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("the backend's connection, dialled before the stop, is still open 3 s after it completed; want it ended")
				}
			case <-time.After(time.Second):
			}
		})
	}
}

// failingDialer counts its dials; each waits until released, then fails
// as a refused connect.
type failingDialer struct {
	entered, release chan struct{}
	dials            *atomic.Int32
}

func (d failingDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	d.dials.Add(1)
	select {
	case d.entered <- struct{}{}:
	default:
	}
	<-d.release
	return nil, syscall.ECONNREFUSED
}

// A goroutine-relayed client whose dial is pending when the proxy stops is
// reset by the stop, and its dial ends there: no attempt on the next
// endpoint, and the failure of the pending one is no endpoint's (not
// counted, not reported), as the event loops fail such a dial with
// relay.ErrLoopStopped. Its goroutine went on through every attempt
// (up to 3.75 s, dialling endpoints for a client gone) and counted a
// failed connection.
func TestStopEndsPendingDialsWithoutFailure(t *testing.T) {
	d := failingDialer{entered: make(chan struct{}, 1), release: make(chan struct{}), dials: new(atomic.Int32)}
	p := New(Options{BindAddress: mustAddr("127.0.0.1"), DataPath: DataPathGoroutines, Dialer: d})
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "127.0.0.2:80", "127.0.0.3:80"))
	p.Sync()
	m := p.metrics.ports.lookup("default/web:p")
	c, err := net.Dial("tcp", proxyAddr(t, p, "default/web:p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-d.entered
	stopNow(p)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("client read after the proxy's stop: %v; want a reset", err)
	}
	close(d.release)
	// The client's goroutine is done once it left the pending set.
	deadline := time.Now().Add(10 * time.Second)
	for {
		pending := 0
		p.sockCfg.conns.pending.each(func(*net.TCPConn) { pending++ })
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the client's goroutine never ended")
		}
		time.Sleep(time.Millisecond)
	}
	if n, failed, dialFailures := d.dials.Load(), m.failed.value(), m.dialFailures.value(); n != 1 || failed != 0 || dialFailures != 0 {
		t.Fatalf("%d dials, %v failed connections, %v dial failures after the stop; want the one pending dial, nothing counted", n, failed, dialFailures)
	}
}
