package proxier

import (
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// DefaultConnectionCloseDeadline is how long past its max age or drain
// time a connection that is never quiet is waited for before it is closed
// anyway (--connection-close-deadline). Long against the 1 s quiet time,
// so a pool with a second's gap between requests still closes at a quiet
// moment and cuts nothing; short against the ages it bounds (minutes) and
// a pod's default 30 s termination grace, so a busy connection to a
// removed endpoint is closed by a FIN of ours before the pod's end resets
// it. (Envoy's max_downstream_connection_duration and HAProxy's
// hard-stop-after close at once, with no wait for quiet at all.)
const DefaultConnectionCloseDeadline = 10 * time.Second

// portLifetime is the lifetime policy in force on one service port's
// sockets: read with one atomic load per accepted connection, replaced by
// the sync loop when a valid annotation (or the node default) changes it.
type portLifetime struct {
	svc      types.NamespacedName
	settings atomic.Pointer[lifetimeSettings]
}

type lifetimeSettings struct {
	maxAge, drain time.Duration
}

func (p *portLifetime) load() lifetimeSettings {
	if p == nil {
		return lifetimeSettings{}
	}
	if s := p.settings.Load(); s != nil {
		return *s
	}
	return lifetimeSettings{}
}

// lifetimes holds every service port's portLifetime, so that a port's
// sockets (cluster and external traffic) share one.
type lifetimes struct {
	ports sync.Map // loadbalancer.ServicePortName → *portLifetime
	// draining counts each Service's ports with a drain time, so that an
	// endpoint change of a Service without one looks at no connection
	// (the scan runs under the endpoints tracker's lock). Written by the
	// sync loop when a drain time comes or goes, read per endpoint change.
	mu       sync.Mutex
	draining map[types.NamespacedName]int
}

func (l *lifetimes) port(name loadbalancer.ServicePortName) *portLifetime {
	if l == nil {
		return nil
	}
	v, _ := l.ports.LoadOrStore(name, &portLifetime{svc: name.NamespacedName})
	return v.(*portLifetime)
}

// set puts settings in force on a port.
func (l *lifetimes) set(name loadbalancer.ServicePortName, s lifetimeSettings) {
	p := l.port(name)
	old := p.load()
	if old == s && p.settings.Load() != nil {
		return
	}
	if (old.drain > 0) != (s.drain > 0) {
		if s.drain > 0 {
			l.countDraining(name.NamespacedName, 1)
		} else {
			l.countDraining(name.NamespacedName, -1)
		}
	}
	p.settings.Store(&s)
}

func (l *lifetimes) remove(name loadbalancer.ServicePortName) {
	if v, ok := l.ports.LoadAndDelete(name); ok && v.(*portLifetime).load().drain > 0 {
		l.countDraining(name.NamespacedName, -1)
	}
}

func (l *lifetimes) countDraining(svc types.NamespacedName, delta int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.draining == nil {
		l.draining = map[types.NamespacedName]int{}
	}
	if n := l.draining[svc] + delta; n > 0 {
		l.draining[svc] = n
	} else {
		delete(l.draining, svc)
	}
}

// drains reports whether a port of svc has a drain time.
func (l *lifetimes) drains(svc types.NamespacedName) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.draining[svc] > 0
}

// syncLifetime puts a port's lifetime in force: the annotations' if valid,
// else the last valid ones stay (OnServiceUpdate logged the error).
func (p *Proxier) syncLifetime(info *servicePortInfo) {
	if info.name.Protocol != v1.ProtocolTCP {
		return
	}
	if info.lifetimeErr != nil {
		// A port that has none in force yet (a new Service with an
		// invalid annotation, served in API mode) gets the node's.
		if pl := p.sockCfg.lifetimes.port(info.name); pl.settings.Load() == nil {
			p.sockCfg.lifetimes.set(info.name, lifetimeSettings{maxAge: p.opts.MaxConnectionAge})
		}
		return
	}
	s := lifetimeSettings{maxAge: p.opts.MaxConnectionAge, drain: info.lifetime.Drain}
	if info.lifetime.MaxAgeSet {
		s.maxAge = info.lifetime.MaxAge
	}
	p.sockCfg.lifetimes.set(info.name, s)
}

// logLifetimeError reports an invalid lifetime annotation once per
// Service and value, at -v=0; p.mu is held.
func logLifetimeError(old, svc *v1.Service) {
	changed := old == nil
	for _, key := range []string{config.MaxConnectionAgeAnnotation, config.DrainRemovedAnnotation} {
		if old != nil && old.Annotations[key] != svc.Annotations[key] {
			changed = true
		}
	}
	if !changed {
		return
	}
	if _, err := config.ParseConnectionLifetime(svc); err != nil {
		klog.ErrorS(err, "Invalid connection lifetime annotation; the Service keeps its last valid one",
			"service", klog.KObj(svc))
	}
}

// drainRemoved gives every connection of svc's draining ports whose
// endpoint is no longer served the port's drain time, then closes it at
// its next quiet moment (unless the endpoint came back meanwhile). It runs
// when svc's endpoints changed; Services without a drain time cost one
// map lookup. A draining Service's change walks the node's connections
// (the registry is not kept per Service, so that accepts share no lock).
func (p *Proxier) drainRemoved(svc types.NamespacedName) {
	if !p.sockCfg.lifetimes.drains(svc) {
		return
	}
	p.sockCfg.conns.tcp.Range(func(k, _ any) bool {
		c := k.(*liveConn)
		rc, _ := c.relay.Load().(quietCloser) // set after sp and lifetime: read them after it
		if rc == nil || c.lifetime == nil || c.lifetime.svc != svc {
			return true
		}
		drain := c.lifetime.load().drain
		if drain <= 0 || c.sp.Serves(c.backend) || !c.draining.CompareAndSwap(false, true) {
			return true
		}
		time.AfterFunc(drain, func() {
			if c.sp.Serves(c.backend) {
				c.draining.Store(false) // back: keep it
				return
			}
			rc.CloseWhenQuiet(0)
		})
		return true
	})
}

// lifetimeEnded counts, and logs, a connection that its max age or
// drain-removed ended. A forced close, which may cut a request, is logged
// at -v=2; a quiet one, as routine as a pool's reconnect, at -v=3.
func (s *tcpProxySocket) lifetimeEnded(how relay.QuietEnd, live *liveConn) {
	switch how {
	case relay.ClosedQuiet:
		s.closedQuiet.Inc()
		klog.V(3).InfoS("Closed a connection at its lifetime's end, at a quiet moment",
			"servicePort", s.label, "client", live.client, "endpoint", live.backend)
	case relay.ClosedAtDeadline:
		s.closedAtDeadline.Inc()
		klog.V(2).InfoS("Closed a busy connection at its lifetime's end: never quiet before the close deadline",
			"servicePort", s.label, "client", live.client, "endpoint", live.backend, "age", time.Since(live.started).Round(time.Millisecond))
	}
}

// quietCloser is a relayed connection of either data path.
type quietCloser interface{ CloseWhenQuiet(time.Duration) }

// startLifetime gives a new connection its port's age limit, if any.
func startLifetime(rc quietCloser, s lifetimeSettings) {
	if s.maxAge > 0 {
		rc.CloseWhenQuiet(s.maxAge)
	}
}
