package proxier

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
	"k8s.io/klog/v2"
)

// A TCP proxy socket stops listening while its fault port is down (the
// fault API's {"enabled":false}), so a client's connect is refused, as at
// Toxiproxy's disabled proxy, whose listener is closed, and at a Service
// whose server is down. Accepted and then reset, a client saw its connect
// succeed (a Toxiproxy test that expects the dial to fail, failed). The
// socket stays bound, so the port and the portal rules naming it stay the
// service port's, and listens again when the port comes up. A port the
// kernel chose (bind to port 0, the allocator's last resort) would be let
// go when its socket stops listening: such a socket keeps accepting and
// resets each client (faults.Port.Accept refuses them).

// relistenRetry is how soon a listen that failed when the port came up is
// tried again, in ns (tests shorten it; retries of other tests' sockets
// may read it meanwhile).
var relistenRetry atomic.Int64

// relistenFault, when set (tests), is the error a listen again fails
// with, as when another socket listens on the port.
var relistenFault atomic.Pointer[error]

func init() { relistenRetry.Store(int64(time.Second)) }

// watchEnabled follows the fault port's enabled state until Close.
func (s *tcpProxySocket) watchEnabled() {
	if s.faults == nil || !s.numbered {
		return
	}
	s.stopWatch = s.faults.OnEnabled(s.setListening)
}

// setListening follows the fault port's enabled state. Its error goes to
// whoever set it (the fault API answers it): the port is up, but this
// socket does not serve it until a retry listens.
func (s *tcpProxySocket) setListening(enabled bool) error {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	if enabled && !s.refusing {
		return nil // up already (a repeated enable, /reset): it listens
	}
	err := s.switchListening(enabled)
	if err != nil {
		klog.ErrorS(err, "Cannot switch the proxy socket's listening for the fault API's enabled", "servicePort", s.label, "enabled", enabled)
	} else {
		s.refusing = !enabled
	}
	if enabled {
		s.listenFailed(err)
	} else {
		s.listenFailed(nil) // down: no listen to retry
	}
	return err
}

// retryListening tries a failed listen again until it works, the port goes
// down again or the socket closes. It fails when another socket listens on
// the port: one that bound it in the instant relay.ListenAgain leaves open.
// The Service's clients go there, or are refused, until it lets go.
func (s *tcpProxySocket) retryListening() {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	s.retrying = false
	_ = s.listenAgainLocked()
}

// listenAgainNow is the sync's retry of a failed listen: the error while
// the socket still does not listen.
func (s *tcpProxySocket) listenAgainNow() error {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	return s.listenAgainLocked()
}

func (s *tcpProxySocket) listenAgainLocked() error {
	if s.listenErr == nil {
		return nil // listening, down, or closed
	}
	err := s.switchListening(true)
	if err == nil {
		s.refusing = false
		klog.InfoS("The proxy socket listens again", "servicePort", s.label)
	}
	s.listenFailed(err)
	return err
}

// listenFailed records the outcome of a listen the port wants (nil: it
// listens), under listenMu: a failure is tried again after relistenRetry
// (one timer at a time), and lists the socket as not serving (cfg.deaf),
// which the sync counts.
func (s *tcpProxySocket) listenFailed(err error) {
	was := s.listenErr
	s.listenErr = err
	if err != nil && !s.retrying {
		s.retrying = true
		time.AfterFunc(time.Duration(relistenRetry.Load()), s.retryListening)
	}
	if (was == nil) != (err == nil) && s.cfg.deaf != nil {
		s.cfg.deaf.set(s, err)
	}
}

// deafSockets are the TCP proxy sockets whose port is up but that could
// not listen again (another socket listens on the port), until they do: a
// sync counts them in service_ports_unserved, shows their error in
// /debug/services, and retries them, as a socket that did not open.
type deafSockets struct {
	mu    sync.Mutex
	socks map[*tcpProxySocket]error
	// changed asks for a sync (the runner's Run; it never blocks).
	changed func()
}

func (d *deafSockets) set(s *tcpProxySocket, err error) {
	d.mu.Lock()
	if err != nil {
		if d.socks == nil {
			d.socks = map[*tcpProxySocket]error{}
		}
		d.socks[s] = err
	} else {
		delete(d.socks, s)
	}
	d.mu.Unlock()
	if d.changed != nil {
		d.changed()
	}
}

// list returns the deaf sockets.
func (d *deafSockets) list() []*tcpProxySocket {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*tcpProxySocket, 0, len(d.socks))
	for s := range d.socks {
		out = append(out, s)
	}
	return out
}

// errors returns why each deaf socket does not listen, by its name (nil
// when none is deaf).
func (d *deafSockets) errors() map[loadbalancer.ServicePortName]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.socks) == 0 {
		return nil
	}
	out := make(map[loadbalancer.ServicePortName]string, len(d.socks))
	for s, err := range d.socks {
		out[s.name] = "the fault API enabled the port, but its proxy socket cannot listen again (retried): " + err.Error()
	}
	return out
}

func (s *tcpProxySocket) switchListening(enabled bool) error {
	switch {
	case enabled && relistenFault.Load() != nil:
		return *relistenFault.Load()
	case s.loopLn != nil && enabled:
		return s.loopLn.Resume()
	case s.loopLn != nil:
		return s.loopLn.Refuse()
	default:
		return s.gate.set(s.ln, enabled)
	}
}

// acceptGate is the goroutine relay's share: its accept loop learns from
// it that an accept error came from a refusal, and waits for the resume.
type acceptGate struct {
	mu       sync.Mutex
	refusing bool
	resumed  chan struct{}
	// refusals counts Refuse calls, so an error of a refusal that came and
	// went while the loop was in accept is told from a failure.
	refusals atomic.Uint64
}

func (g *acceptGate) set(ln *net.TCPListener, enabled bool) error {
	raw, err := ln.SyscallConn()
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refusing != enabled {
		return nil // no change
	}
	if !enabled {
		g.refusing, g.resumed = true, make(chan struct{})
		g.refusals.Add(1)
		return control(raw, relay.StopListening)
	}
	if err := control(raw, relay.ListenAgain); err != nil {
		return err // still refusing: retryListening tries again
	}
	g.refusing = false
	close(g.resumed)
	return nil
}

// control runs op on raw's descriptor.
func control(raw syscall.RawConn, op func(fd int) error) error {
	var opErr error
	if err := raw.Control(func(fd uintptr) { opErr = op(int(fd)) }); err != nil {
		return err
	}
	return opErr
}

// refused reports whether an accept error that followed a look at
// refusals (since) came from a refusal; wait, if not nil, ends with it.
func (g *acceptGate) refused(since uint64) (wait <-chan struct{}, refused bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refusing {
		return g.resumed, true
	}
	return nil, g.refusals.Load() != since
}
