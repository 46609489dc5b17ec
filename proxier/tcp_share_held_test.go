package proxier

import (
	"io"
	"net"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// Every client admitted to a socket's share leaves it exactly once,
// whichever way its connection ends: a leak makes the port refuse every
// client for good once it reaches its share, a second release lets it
// hold more than its share. Each path of both data paths (and of a
// faulted connection, which the event loops hand to the goroutine relay)
// is driven here, and the count must come back to 0 after each, and after
// a stop that finds dials pending.
func TestTCPShareHeldReleasedOnEveryPath(t *testing.T) {
	echo := echoBackends(t, "127.0.0.2")[0]
	silentPort := portOf(serveTCP(t, "127.0.0.2", func(net.Conn) {}).Addr())
	silentListener(t, "127.0.0.6", silentPort)
	endpoints := heldEndpoints{echo: echo, silent: "127.0.0.6:" + silentPort,
		closed: "127.0.0.7:" + silentPort} // nothing listens there: refused
	for _, path := range DataPaths {
		t.Run(path, func(t *testing.T) { testTCPShareHeld(t, path, endpoints) })
		t.Run(path+"/stop", func(t *testing.T) { testTCPShareHeldAtStop(t, path, endpoints) })
	}
}

type heldEndpoints struct{ echo, silent, closed string }

// heldProxier serves a Service of each kind the held tests drive.
type heldProxier struct {
	p       *Proxier
	addr    map[string]string
	sockets map[string]*tcpProxySocket
}

func newHeldProxier(t *testing.T, path string, dialTimeout time.Duration, ep heldEndpoints) *heldProxier {
	t.Helper()
	p := newTestProxier(t, Options{DataPath: path, Faults: faults.NewTable(0, 0, nil),
		DialTimeouts: []time.Duration{dialTimeout, dialTimeout}})
	const latency = `[{"type":"latency","attributes":{"latency":1}}]`
	services := []struct {
		name, endpoint, faults string
	}{
		{"echo", ep.echo, ""},
		{"echo-faulted", ep.echo, latency},
		{"silent", ep.silent, ""},
		{"silent-faulted", ep.silent, latency},
		{"refused", ep.closed, ""},
		{"refused-faulted", ep.closed, latency},
		{"refuse", ep.echo, `[{"type":"refuse"}]`},
		{"delay", ep.echo, `[{"type":"connect_delay","attributes":{"delay":5000}}]`},
	}
	h := &heldProxier{p: p, addr: map[string]string{}, sockets: map[string]*tcpProxySocket{}}
	for i, svc := range services {
		opts := []svcOpt{withClusterIP("10.96.1." + string(rune('1'+i)))}
		if svc.faults != "" {
			opts = append(opts, withFaults(svc.faults))
		}
		p.OnServiceAdd(makeService(svc.name, opts...))
		p.OnEndpointSliceAdd(makeSlice(svc.name, v1.ProtocolTCP, svc.endpoint))
	}
	p.Sync()
	for _, svc := range services {
		sp := "default/" + svc.name + ":p"
		h.addr[svc.name] = proxyAddr(t, p, sp)
		h.sockets[svc.name] = p.active[p.lbName(sp)].socket.(*tcpProxySocket)
	}
	return h
}

// waitNone waits up to 5 s for every socket to hold no connection.
func (h *heldProxier) waitNone(t *testing.T, what string) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		none := true
		for _, s := range h.sockets {
			none = none && s.held.Load() == 0
		}
		if none {
			return
		}
		if time.Now().After(end) {
			for name, s := range h.sockets {
				if n := s.held.Load(); n != 0 {
					t.Errorf("%s: the socket of %s holds %d connections, want 0", what, name, n)
				}
			}
			t.FailNow()
		}
	}
}

func (h *heldProxier) waitHeld(t *testing.T, name string, want int64) {
	t.Helper()
	waitHeld(t, func() int64 { return h.sockets[name].held.Load() }, want)
}

func (h *heldProxier) dial(t *testing.T, name string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", h.addr[name], 2*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return c.(*net.TCPConn)
}

func resetConn(c *net.TCPConn) {
	_ = c.SetLinger(0)
	c.Close()
}

// Dials of 10 s: a client whose dial is abandoned must leave the share
// at its reset, long before its attempt's end.
func testTCPShareHeld(t *testing.T, path string, ep heldEndpoints) {
	h := newHeldProxier(t, path, 10*time.Second, ep)

	// Relayed, then ended by the client's close or reset.
	for _, name := range []string{"echo", "echo-faulted"} {
		for _, end := range []func(*net.TCPConn){func(c *net.TCPConn) { c.Close() }, resetConn} {
			c := h.dial(t, name)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write([]byte("hi")); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			h.waitHeld(t, name, 1)
			end(c)
			h.waitNone(t, name+": relayed, then ended")
		}
	}
	// A dial abandoned by the client's reset; a dial that failed; a client
	// refused by a fault; a client that reset in its connect_delay.
	for _, name := range []string{"silent", "silent-faulted", "delay"} {
		c := h.dial(t, name)
		h.waitHeld(t, name, 1)
		// Past clientWatchAfter: the goroutine relay's watch of the client
		// is started.
		time.Sleep(50 * time.Millisecond)
		resetConn(c)
		h.waitNone(t, name+": the client reset while it waited")
	}
	for _, name := range []string{"refused", "refused-faulted", "refuse"} {
		_ = firstRead(h.addr[name])
		h.waitNone(t, name+": refused")
	}
}

// The proxy stops while dials are pending. The goroutine relay's dial goes
// on to its attempts' end (the stop reset its client, which it then finds
// stopped): dials of 300 ms here.
func testTCPShareHeldAtStop(t *testing.T, path string, ep heldEndpoints) {
	h := newHeldProxier(t, path, 300*time.Millisecond, ep)
	for _, name := range []string{"silent", "silent-faulted", "delay"} {
		c := h.dial(t, name)
		defer c.Close()
		h.waitHeld(t, name, 1)
	}
	stopNow(h.p)
	h.waitNone(t, "stopped with dials pending")
}
