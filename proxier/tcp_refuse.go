package proxier

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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

func init() { relistenRetry.Store(int64(time.Second)) }

// watchEnabled follows the fault port's enabled state until Close.
func (s *tcpProxySocket) watchEnabled() {
	if s.faults == nil || !s.numbered {
		return
	}
	s.stopWatch = s.faults.OnEnabled(s.setListening)
}

func (s *tcpProxySocket) setListening(enabled bool) {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	s.wantListening = enabled
	if err := s.switchListening(enabled); err != nil {
		klog.ErrorS(err, "Cannot switch the proxy socket's listening for the fault API's enabled", "servicePort", s.label, "enabled", enabled)
		if enabled {
			time.AfterFunc(time.Duration(relistenRetry.Load()), s.retryListening)
		}
	}
}

// retryListening tries a failed listen again until it works, the port goes
// down again or the socket closes. It fails when another socket listens on
// the port: one that bound it in the instant relay.ListenAgain leaves open.
// The Service's clients go there, or are refused, until it lets go.
func (s *tcpProxySocket) retryListening() {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	select {
	case <-s.closed:
		return
	default:
	}
	if !s.wantListening {
		return
	}
	if err := s.switchListening(true); err != nil {
		time.AfterFunc(time.Duration(relistenRetry.Load()), s.retryListening)
		return
	}
	klog.InfoS("The proxy socket listens again", "servicePort", s.label)
}

func (s *tcpProxySocket) switchListening(enabled bool) error {
	switch {
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
