package proxier

import (
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// syncPolicies hands every Service's traffic policy to the endpoints
// tracker (which re-filters its endpoints when a policy changed) and the
// healthCheckNodePorts to the service health server.
func (p *Proxier) syncPolicies(want map[loadbalancer.ServicePortName]*servicePortInfo) {
	policies := map[types.NamespacedName]trafficPolicy{}
	healthPorts := map[types.NamespacedName]int{}
	for _, info := range want {
		policies[info.name.NamespacedName] = info.policy
		if info.policy.externalLocal && info.healthCheckNodePort != 0 {
			healthPorts[info.name.NamespacedName] = info.healthCheckNodePort
		}
	}
	for nn := range p.policies {
		if _, ok := policies[nn]; !ok {
			p.endpoints.setPolicy(nn, trafficPolicy{}, false)
		}
	}
	for nn, pol := range policies {
		p.endpoints.setPolicy(nn, pol, true)
	}
	p.policies = policies
	if p.opts.ServiceHealth != nil {
		if err := p.opts.ServiceHealth.SyncServices(healthPorts); err != nil {
			klog.ErrorS(err, "Failed to sync healthCheckNodePort servers")
		}
	}
}

// syncExternalSocket opens or closes the second socket a service port needs
// while its external traffic has its own endpoint set.
func (p *Proxier) syncExternalSocket(ap *activePort, info *servicePortInfo) {
	need := info.policy.splitExternal()
	switch {
	case need && ap.external == nil:
		ext := externalName(info.name)
		sp := p.lb.ServicePort(ext)
		p.lb.SetAffinity(ext, info.affinity)
		sock, err := p.ports.Open(func(port int) (proxySocket, error) {
			return p.listen(info.name, p.opts.BindAddress, port, info.hasIPv6(), sp, ap.faults, p.sockCfg)
		})
		if err != nil {
			p.lb.DeleteServicePort(ext)
			klog.ErrorS(err, "Failed to open external proxy socket", "servicePort", info.name)
			return
		}
		go sock.Serve()
		ap.external, ap.externalPort = sock, sock.Port()
	case !need && ap.external != nil:
		p.closeExternalSocket(ap)
	}
}

func (p *Proxier) closeExternalSocket(ap *activePort) {
	if ap.external == nil {
		return
	}
	_ = ap.external.Close()
	p.ports.Release(ap.externalPort)
	p.lb.DeleteServicePort(externalName(ap.info.name))
	ap.external, ap.externalPort = nil, 0
}

// LocalEndpoints is the number of ready endpoints of a Service on this node,
// what its healthCheckNodePort reports.
func (p *Proxier) LocalEndpoints(svc types.NamespacedName) int {
	return p.endpoints.localEndpoints(svc)
}
