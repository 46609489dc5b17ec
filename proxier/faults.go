package proxier

import (
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// syncFaults hands a service port's declared toxics to its fault port (a
// port just opened gets them here). An invalid annotation changes nothing:
// the fault port keeps the last valid toxics, and applyFaultsNow has
// logged it. Under p.mu, as applyFaultsNow: an annotation changed since
// the sync parsed info (applyFaultsNow gave it to the port meanwhile) is
// applied, if valid, rather than info's older toxics, which reverted it
// until the next sync.
func (p *Proxier) syncFaults(ap *activePort, info *servicePortInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	toxics, err := info.toxics, info.faultsErr
	nn := info.name.NamespacedName
	if svc := p.services[nn]; svc != nil && svc.Annotations[faults.Annotation] != info.faultsAnnotation {
		latest, latestErr := faults.ForService(svc)
		if v, ok := p.validFaults[nn]; latestErr != nil && ok {
			// The latest is invalid: the last valid one stands (the
			// port has it already, unless it opened since), not the one
			// this sync parsed, which may be older.
			latest, latestErr = faults.ForService(v.on(svc))
		}
		if latestErr == nil {
			toxics, err = latest[info.name.Port], nil
		}
	}
	if err == nil {
		p.sockCfg.conns.cutDowns(ap.faults.SetDeclared(toxics))
	}
}

// applyFaultsNow gives a changed faults annotation to the Service's open
// ports at once, without waiting for a sync: toxics are not rules, so like
// endpoints they need not wait for --iptables-min-sync-period. An invalid
// annotation is logged here, once per Service and value, at -v=0 (in API
// mode nothing else reports it); p.mu is held.
func (p *Proxier) applyFaultsNow(old, svc *v1.Service) {
	value, has := svc.Annotations[faults.Annotation]
	if old != nil {
		if oldValue, oldHas := old.Annotations[faults.Annotation]; oldHas == has && oldValue == value {
			return
		}
	} else if !has {
		return
	}
	infos := servicePorts(svc) // parses the annotation once for all ports
	for _, info := range infos {
		if info.faultsErr != nil {
			klog.ErrorS(info.faultsErr, "Invalid faults annotation; the Service keeps its last valid faults",
				"service", klog.KObj(svc), "field", "metadata.annotations[kube-userspace-proxy/faults]")
			return
		}
		cut, _ := p.opts.Faults.Declare(info.faultName, info.toxics)
		// A down it declares cuts the live connections it draws; those
		// faults does not track (no fault API) are cut here.
		p.sockCfg.conns.cutDowns(cut)
	}
	if len(infos) > 0 {
		p.validFaults[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = faultsAnnotation{value, has}
	}
}

// faultsAnnotation is a Service's faults annotation: its value, and
// whether it has one.
type faultsAnnotation struct {
	value string
	has   bool
}

// on returns svc with a as its faults annotation (and no other), for
// faults.ForService to parse a against svc's ports.
func (a faultsAnnotation) on(svc *v1.Service) *v1.Service {
	c := *svc
	c.Annotations = nil
	if a.has {
		c.Annotations = map[string]string{faults.Annotation: a.value}
	}
	return &c
}

// upstreamOf lists a port's endpoints, what the fault API shows as the
// proxy's upstream.
func (p *Proxier) upstreamOf(name loadbalancer.ServicePortName) string {
	snap, ok := p.lb.Snapshot(name)
	if !ok {
		return ""
	}
	eps := make([]string, 0, len(snap.Endpoints))
	for _, ep := range snap.Endpoints {
		eps = append(eps, ep.String())
	}
	return strings.Join(eps, ",")
}
