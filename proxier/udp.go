package proxier

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// maxDatagram fits any UDP payload; the legacy 4 KiB buffer truncated.
const maxDatagram = 64 * 1024

// udpProxySocket relays datagrams for one service port. Each client ip:port
// gets its own connected socket to the chosen backend; replies are written
// back through the service socket so that conntrack turns their source back
// into the service address the client sent to.
type udpProxySocket struct {
	name      loadbalancer.ServicePortName
	label     string
	conn      *net.UDPConn
	sp        *loadbalancer.ServicePort
	cfg       *socketConfig
	noBackend noBackendLog
	// faults shapes datagrams; its plan is loaded per datagram (one atomic
	// load, nil when no toxic applies).
	faults *faults.Port

	sessions                        prometheus.Gauge
	dialFailures, bytesIn, bytesOut prometheus.Counter
	droppedNoBackend                prometheus.Counter

	mu      sync.Mutex // guards clients; per socket, never global
	clients map[netip.AddrPort]*udpSession

	closer
}

type udpSession struct {
	backend *net.UDPConn
	// lastSent is when the client last sent (UnixNano). Serve stores it per
	// datagram, an atomic store; the relay goroutine re-arms its read
	// deadline from it only when the deadline fires, so the per-datagram
	// path touches no timer.
	lastSent atomic.Int64
	// deferredUntil is when the last datagram a fault delayed (latency,
	// reorder) goes out (UnixNano): the session must outlive it even when
	// the delay is longer than the idle timeout. Written by Serve only.
	deferredUntil atomic.Int64
	// sendUp and sendDown deliver a datagram a fault let through, perhaps
	// later and from a timer goroutine.
	sendUp, sendDown func([]byte)
}

func (s *udpProxySocket) datagramFaults() *faults.DatagramPlan {
	if s.faults == nil {
		return nil
	}
	return s.faults.Datagrams()
}

func newUDPProxySocket(name loadbalancer.ServicePortName, conn *net.UDPConn, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) *udpProxySocket {
	label := name.String()
	m := cfg.metrics
	return &udpProxySocket{
		name: name, label: label, conn: conn, sp: sp, cfg: cfg, faults: fp,
		clients:          map[netip.AddrPort]*udpSession{},
		closer:           newCloser(),
		sessions:         m.UDPSessions.WithLabelValues(label),
		dialFailures:     m.DialFailures.WithLabelValues(label),
		bytesIn:          m.BytesTotal.WithLabelValues(label, "in"),
		bytesOut:         m.BytesTotal.WithLabelValues(label, "out"),
		droppedNoBackend: m.ConnectionsFailed.WithLabelValues(label),
	}
}

func (s *udpProxySocket) Port() int { return s.conn.LocalAddr().(*net.UDPAddr).Port }

func (s *udpProxySocket) Close() error {
	return s.closeWith(s.conn.Close)
}

func (s *udpProxySocket) Serve() {
	buf := make([]byte, maxDatagram)
	for {
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-s.closed:
				return
			default:
			}
			klog.V(2).InfoS("UDP read failed", "servicePort", s.label, "err", err)
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		sess, err := s.session(from)
		if err != nil {
			s.droppedNoBackend.Inc()
			s.noBackend.report(s.label, from, err)
			continue
		}
		sess.lastSent.Store(time.Now().UnixNano())
		if plan := s.datagramFaults(); plan != nil {
			if d := plan.Send(faults.StreamUp, from.Addr(), buf[:n], sess.sendUp); d > 0 {
				if until := time.Now().Add(d).UnixNano(); until > sess.deferredUntil.Load() {
					sess.deferredUntil.Store(until)
				}
			}
			s.bytesIn.Add(float64(n))
			continue
		}
		if _, err := sess.backend.Write(buf[:n]); err != nil {
			klog.V(3).InfoS("UDP write to backend failed", "servicePort", s.label, "client", from, "err", err)
			continue
		}
		s.bytesIn.Add(float64(n))
	}
}

// session returns the client's backend socket, creating it (and its reply
// relay) on the first datagram.
func (s *udpProxySocket) session(client netip.AddrPort) (*udpSession, error) {
	s.mu.Lock()
	sess := s.clients[client]
	s.mu.Unlock()
	if sess != nil {
		return sess, nil
	}
	var lastErr error
	for i := range s.cfg.dialTimeouts {
		ep, err := s.sp.Next(client.Addr(), i > 0)
		if err != nil {
			return nil, err
		}
		backend, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ep))
		if err != nil {
			lastErr = err
			s.dialFailures.Inc()
			continue
		}
		sess = &udpSession{backend: backend}
		sess.sendUp = func(b []byte) { _, _ = backend.Write(b) }
		sess.sendDown = func(b []byte) { _, _ = s.conn.WriteToUDPAddrPort(b, client) }
		sess.lastSent.Store(time.Now().UnixNano())
		s.mu.Lock()
		s.clients[client] = sess
		s.mu.Unlock()
		s.sessions.Inc()
		go s.relayReplies(client, sess)
		return sess, nil
	}
	return nil, lastErr
}

// relayReplies copies backend replies to the client until the session has
// been idle for udpIdleTimeout or the socket closes.
func (s *udpProxySocket) relayReplies(client netip.AddrPort, sess *udpSession) {
	defer func() {
		s.mu.Lock()
		delete(s.clients, client)
		s.mu.Unlock()
		sess.backend.Close()
		s.sessions.Dec()
	}()
	buf := make([]byte, maxDatagram)
	idle := s.cfg.udpIdleTimeout
	_ = sess.backend.SetReadDeadline(time.Now().Add(idle))
	var lastReply int64
	for {
		n, err := sess.backend.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Idle only if neither side sent since: otherwise move the
			// deadline to the last datagram plus the timeout.
			next := time.Unix(0, max(sess.lastSent.Load(), lastReply, sess.deferredUntil.Load())).Add(idle)
			if time.Now().Before(next) {
				_ = sess.backend.SetReadDeadline(next)
				continue
			}
			return
		}
		if err != nil {
			return // refused (ICMP), or closed
		}
		lastReply = time.Now().UnixNano()
		if plan := s.datagramFaults(); plan != nil {
			// A delayed reply goes out through the service socket, which
			// outlives the session: no need to keep the session for it.
			plan.Send(faults.StreamDown, client.Addr(), buf[:n], sess.sendDown)
			s.bytesOut.Add(float64(n))
			continue
		}
		if _, err := s.conn.WriteToUDPAddrPort(buf[:n], client); err != nil {
			return
		}
		s.bytesOut.Add(float64(n))
	}
}
