package proxier

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// Connection lifetime annotations of a Service (opt-in, per Service; no
// kube-proxy mode has them). Long-lived connections defeat balancing: a
// pool of kept-alive connections stays on the endpoints it started with
// after a scale-up, and on endpoints that were removed.
const (
	// MaxConnectionAgeAnnotation: a TCP connection older than this Go
	// duration is closed at its next quiet moment ("5m"; "0" turns off the
	// node's --max-connection-age for this Service).
	MaxConnectionAgeAnnotation = "kube-userspace-proxy/max-connection-age"
	// DrainRemovedAnnotation: a TCP connection whose endpoint left the
	// Service is closed this long after, at its next quiet moment ("30s").
	DrainRemovedAnnotation = "kube-userspace-proxy/drain-removed"
)

// connLifetime is what a Service's annotations ask for.
type connLifetime struct {
	maxAge    time.Duration
	maxAgeSet bool // the annotation is present (else: the node's default)
	drain     time.Duration
}

// lifetimeOf parses a Service's lifetime annotations; an error names the
// field and says what is wrong.
func lifetimeOf(svc *v1.Service) (connLifetime, error) {
	var l connLifetime
	parse := func(key string) (time.Duration, bool, error) {
		v, ok := svc.Annotations[key]
		if !ok {
			return 0, false, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, true, fmt.Errorf("metadata.annotations[%s]: %q is not a duration (e.g. \"5m\", \"90s\")", key, v)
		}
		if d < 0 {
			return 0, true, fmt.Errorf("metadata.annotations[%s]: %q must not be negative", key, v)
		}
		return d, true, nil
	}
	var err error
	if l.maxAge, l.maxAgeSet, err = parse(MaxConnectionAgeAnnotation); err != nil {
		return connLifetime{}, err
	}
	if l.drain, _, err = parse(DrainRemovedAnnotation); err != nil {
		return connLifetime{}, err
	}
	return l, nil
}

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
	// draining counts ports with a drain time, so endpoint changes of
	// other Services look at no connection.
	draining atomic.Int64
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
			l.draining.Add(1)
		} else {
			l.draining.Add(-1)
		}
	}
	p.settings.Store(&s)
}

func (l *lifetimes) remove(name loadbalancer.ServicePortName) {
	if v, ok := l.ports.LoadAndDelete(name); ok && v.(*portLifetime).load().drain > 0 {
		l.draining.Add(-1)
	}
}

// syncLifetime puts a port's lifetime in force: the annotations' if valid,
// else the last valid ones stay (OnServiceUpdate logged the error).
func (p *Proxier) syncLifetime(info *servicePortInfo) {
	if info.name.Protocol != v1.ProtocolTCP || info.lifetimeErr != nil {
		return
	}
	s := lifetimeSettings{maxAge: p.opts.MaxConnectionAge, drain: info.lifetime.drain}
	if info.lifetime.maxAgeSet {
		s.maxAge = info.lifetime.maxAge
	}
	p.sockCfg.lifetimes.set(info.name, s)
}

// logLifetimeError reports an invalid lifetime annotation once per
// Service and value, at -v=0; p.mu is held.
func logLifetimeError(old, svc *v1.Service) {
	changed := old == nil
	for _, key := range []string{MaxConnectionAgeAnnotation, DrainRemovedAnnotation} {
		if old != nil && old.Annotations[key] != svc.Annotations[key] {
			changed = true
		}
	}
	if !changed {
		return
	}
	if _, err := lifetimeOf(svc); err != nil {
		klog.ErrorS(err, "Invalid connection lifetime annotation; the Service keeps its last valid one",
			"service", klog.KObj(svc))
	}
}

// drainRemoved gives every connection of svc's draining ports whose
// endpoint is no longer served the port's drain time, then closes it at
// its next quiet moment (unless the endpoint came back meanwhile). It runs
// when svc's endpoints changed; Services without a drain time cost one
// atomic load.
func (p *Proxier) drainRemoved(svc types.NamespacedName) {
	if p.sockCfg.lifetimes.draining.Load() == 0 {
		return
	}
	p.sockCfg.conns.tcp.Range(func(k, _ any) bool {
		c := k.(*liveConn)
		rc := c.relay.Load() // set after sp and lifetime: read them after it
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

// startLifetime gives a new connection its port's age limit, if any.
func startLifetime(rc *relay.Conn, s lifetimeSettings) {
	if s.maxAge > 0 {
		rc.CloseWhenQuiet(s.maxAge)
	}
}
