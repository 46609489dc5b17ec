package proxier

import (
	"strings"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// syncFaults hands a service port's declared toxics to its fault port. An
// invalid annotation is logged once per value (at -v=0: in API mode
// nothing else reports it) and the port keeps its last valid toxics.
func (p *Proxier) syncFaults(ap *activePort, info *servicePortInfo) {
	if info.faultsErr != nil {
		if ap.info.annotation != info.annotation || ap.info.faultsErr == nil || ap.info == info {
			klog.ErrorS(info.faultsErr, "Invalid faults annotation; the service port keeps its last valid faults",
				"service", info.name.NamespacedName, "annotation", "metadata.annotations[kube-userspace-proxy/faults]")
		}
		// Carry the last valid toxics forward so a later sync does not
		// mistake the error for "no toxics".
		info.toxics = ap.info.toxics
		if ap.info == info {
			info.toxics = nil
		}
		return
	}
	ap.faults.SetDeclared(info.toxics)
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
