package proxier

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

func withAnnotations(kv ...string) svcOpt {
	return func(s *v1.Service) {
		s.Annotations = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			s.Annotations[kv[i]] = kv[i+1]
		}
	}
}

// The annotation overrides the node's default ("0" turns it off); an
// invalid value leaves the last valid one in force.
func TestLifetimeAnnotationAndDefault(t *testing.T) {
	p := newTestProxier(t, Options{MaxConnectionAge: 2 * time.Minute})
	spn := servicePortName("web")
	steps := []struct {
		ann  []string
		want lifetimeSettings
	}{
		{nil, lifetimeSettings{maxAge: 2 * time.Minute}},
		{[]string{config.MaxConnectionAgeAnnotation, "5m", config.DrainRemovedAnnotation, "30s"}, lifetimeSettings{maxAge: 5 * time.Minute, drain: 30 * time.Second}},
		{[]string{config.MaxConnectionAgeAnnotation, "5x", config.DrainRemovedAnnotation, "30s"}, lifetimeSettings{maxAge: 5 * time.Minute, drain: 30 * time.Second}},
		{[]string{config.MaxConnectionAgeAnnotation, "0"}, lifetimeSettings{}},
		{nil, lifetimeSettings{maxAge: 2 * time.Minute}},
	}
	for i, st := range steps {
		p.OnServiceUpdate(nil, makeService("web", withAnnotations(st.ann...)))
		p.Sync()
		if got := p.sockCfg.lifetimes.port(spn).load(); got != st.want {
			t.Fatalf("step %d %v: in force %+v, want %+v", i, st.ann, got, st.want)
		}
	}
	if p.sockCfg.lifetimes.drains(spn.NamespacedName) {
		t.Errorf("%v counted as draining after the drain annotation went", spn.NamespacedName)
	}
}

func servicePortName(svc string) loadbalancer.ServicePortName {
	return loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: svc}, Port: "p", Protocol: v1.ProtocolTCP}
}

// echoBackends listens on each ip at one shared port and echoes.
func echoBackends(t *testing.T, ips ...string) []string {
	t.Helper()
	var addrs []string
	port := "0"
	for _, ip := range ips {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, port))
		if err != nil {
			t.Fatal(err)
		}
		port = portOf(ln.Addr())
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
			}
		}()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

func dialExchange(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	return c.(*net.TCPConn)
}

// waitFIN waits up to within for the proxy's FIN and returns when it came.
func waitFIN(t *testing.T, c *net.TCPConn, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(within))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || err != io.EOF {
		t.Fatalf("read %d bytes, %v after %v; want a FIN (EOF)", n, err, time.Since(start))
	}
	return time.Since(start)
}

// --max-connection-age closes an idle kept-alive connection with a FIN
// once it is old enough and quiet.
func TestMaxConnectionAgeClosesWithFIN(t *testing.T) {
	be := echoBackends(t, "127.0.0.2")
	p := newTestProxier(t, Options{MaxConnectionAge: 300 * time.Millisecond, ConnectionCloseQuiet: 100 * time.Millisecond})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, be...))
	p.Sync()
	start := time.Now()
	c := dialExchange(t, proxyAddr(t, p, "default/web:p"))
	waitFIN(t, c, 3*time.Second)
	if age := time.Since(start); age < 300*time.Millisecond {
		t.Fatalf("closed at %v, younger than the 300 ms max age", age)
	}
}

// A kept-alive connection with a request every 100 ms is never quiet for
// the 300 ms quiet time: past its max age it is closed at the close
// deadline all the same (before, never), on both data paths, and counted
// as such.
func TestMaxConnectionAgeClosesBusyAtDeadline(t *testing.T) {
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) {
			be := echoBackends(t, "127.0.0.2")
			p := newTestProxier(t, Options{DataPath: path, MaxConnectionAge: 300 * time.Millisecond,
				ConnectionCloseQuiet: 300 * time.Millisecond, ConnectionCloseDeadline: 500 * time.Millisecond})
			p.OnServiceAdd(makeService("web"))
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, be...))
			p.Sync()
			start := time.Now()
			c := dialExchange(t, proxyAddr(t, p, "default/web:p"))
			var err error
			for exchanges := 0; time.Since(start) < 3*time.Second; exchanges++ {
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				if _, err = c.Write([]byte("hi")); err == nil {
					_, err = io.ReadFull(c, make([]byte, 2))
				}
				if err != nil {
					t.Logf("closed %v after the dial, %d exchanges later: %v", time.Since(start).Round(time.Millisecond), exchanges, err)
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err == nil {
				t.Fatal("a busy connection is still open 3 s after the dial, past its 300 ms age and 500 ms close deadline")
			}
			if took := time.Since(start); took > 1500*time.Millisecond {
				t.Errorf("closed %v after the dial, want about 800 ms (age and close deadline)", took.Round(time.Millisecond))
			}
			c.Close()
			m := p.metrics.ports.lookup("default/web:p")
			for deadline := time.Now().Add(2 * time.Second); m.closedAtDeadline.value() != 1 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			if got := m.closedAtDeadline.value(); got != 1 {
				t.Errorf("lifetime_closes_total{when=deadline} = %v, want 1", got)
			}
		})
	}
}

// drain-removed closes connections to an endpoint removed from the
// Service after the drain time, with a FIN; without the annotation they
// stay.
func TestDrainRemoved(t *testing.T) {
	be := echoBackends(t, "127.0.0.2", "127.0.0.3")
	p := newTestProxier(t, Options{ConnectionCloseQuiet: 50 * time.Millisecond})
	p.OnServiceAdd(makeService("drain", withAnnotations(config.DrainRemovedAnnotation, "300ms")))
	p.OnServiceAdd(makeService("keep", withClusterIP("10.96.0.11")))
	p.OnEndpointSliceAdd(makeSlice("drain", v1.ProtocolTCP, be[0]))
	p.OnEndpointSliceAdd(makeSlice("keep", v1.ProtocolTCP, be[0]))
	p.Sync()
	drained := dialExchange(t, proxyAddr(t, p, "default/drain:p"))
	kept := dialExchange(t, proxyAddr(t, p, "default/keep:p"))

	removed := time.Now()
	p.OnEndpointSliceUpdate(nil, makeSlice("drain", v1.ProtocolTCP, be[1]))
	p.OnEndpointSliceUpdate(nil, makeSlice("keep", v1.ProtocolTCP, be[1]))
	waitFIN(t, drained, 3*time.Second)
	if d := time.Since(removed); d < 300*time.Millisecond {
		t.Fatalf("closed %v after the endpoint left, before the 300 ms drain", d)
	}
	// The one without the annotation still works.
	if _, err := kept.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	_ = kept.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(kept, make([]byte, 2)); err != nil {
		t.Fatalf("connection of the Service without drain-removed: %v", err)
	}
}

// quietCloserFunc is a relayed connection for tests that need none.
type quietCloserFunc func(time.Duration)

func (f quietCloserFunc) CloseWhenQuiet(d time.Duration) { f(d) }

// An endpoint change of a Service without drain-removed looks at no
// connection, though another Service on the node has the annotation and
// the node holds many connections: the change runs under the endpoints
// tracker's lock (a walk of 200,000 connections took 31-38 ms per change).
// The draining Service's own change still finds its connection to a
// removed endpoint.
func TestDrainRemovedScansOnlyForADrainingService(t *testing.T) {
	lb := loadbalancer.New(clock.RealClock{}, loadbalancer.Limits{})
	p := &Proxier{sockCfg: &socketConfig{conns: &connRegistry{}, lifetimes: &lifetimes{}}}
	register := func(spn loadbalancer.ServicePortName, backend netip.AddrPort) *liveConn {
		c := &liveConn{backend: backend, sp: lb.ServicePort(spn), lifetime: p.sockCfg.lifetimes.port(spn)}
		c.relay.Store(quietCloser(quietCloserFunc(func(time.Duration) {})))
		p.sockCfg.conns.tcp.Store(c, struct{}{})
		return c
	}
	busy, drainer := servicePortName("busy"), servicePortName("drainer")
	for range 50000 {
		register(busy, netip.MustParseAddrPort("10.0.0.1:80"))
	}
	p.sockCfg.lifetimes.set(drainer, lifetimeSettings{drain: time.Hour})
	removed := register(drainer, netip.MustParseAddrPort("10.0.0.2:80")) // its port serves no endpoint

	// The fastest of a few changes, so that a pause of the machine does
	// not count.
	cost := func(svc types.NamespacedName) time.Duration {
		fastest := time.Duration(1 << 62)
		for range 5 {
			start := time.Now()
			p.drainRemoved(svc)
			fastest = min(fastest, time.Since(start))
		}
		return fastest
	}
	own := cost(drainer.NamespacedName)
	if !removed.draining.Load() {
		t.Fatal("the draining Service's endpoint change left its connection to a removed endpoint alone")
	}
	other := cost(servicePortName("churning").NamespacedName)
	t.Logf("endpoint change at 50,000 connections of another Service: %v for a Service with drain-removed, %v for one without", own, other)
	if other > own/10 {
		t.Fatalf("an endpoint change of a Service without drain-removed took %v, as long as a walk of the node's connections (%v)", other, own)
	}
}
