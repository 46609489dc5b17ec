package proxier

import (
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// syncFaults hands a service port's declared toxics to its fault port (a
// port just opened gets them here). An invalid annotation changes nothing:
// the fault port keeps the last valid toxics, and applyFaultsNow has
// logged it.
func (p *Proxier) syncFaults(ap *activePort, info *servicePortInfo) {
	if info.faultsErr == nil {
		ap.faults.SetDeclared(info.toxics)
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
		p.opts.Faults.Declare(info.faultName, info.toxics)
	}
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
