// Package iptables owns the proxy's netfilter state: the portal rule model,
// its rendering into our chains, one iptables-restore per sync, repair of
// rules someone else changed, and cleanup.
package iptables

import "net/netip"

// Protocol of a portal, lower case as iptables spells it.
type Protocol string

const (
	TCP Protocol = "tcp"
	UDP Protocol = "udp"
)

// Portal sends traffic for one service address to one proxy socket.
// A portal with NodePort set matches any local address (behind
// --nodeport-addresses) on that port; otherwise it matches IP:Port.
type Portal struct {
	Name      string // "ns/svc:port", used as the rule comment
	Protocol  Protocol
	IP        netip.Addr // ClusterIP, externalIP or LoadBalancer ingress IP; zero for NodePorts
	Port      int        // service port, or the node port when NodePort
	NodePort  bool
	ProxyPort int // where the proxy socket listens
	// ClusterProxyPort, when set on a NodePort, externalIP or LB IP portal
	// whose ProxyPort serves only node-local endpoints
	// (externalTrafficPolicy: Local), is the socket of the cluster-wide
	// endpoints: traffic from this node and from pods (Config.ClusterCIDRs)
	// goes there instead, as kube-proxy's shortcut does, so a node without a
	// local endpoint can still reach its own LoadBalancer IP.
	ClusterProxyPort int
	// SourceRanges, on a LoadBalancer-IP portal, are the Service's
	// loadBalancerSourceRanges: a new connection to IP:Port from any other
	// source is dropped (KUBE-LB-SOURCE-RANGES). Ranges of the other family
	// are ignored, and with none of this family every source is allowed, as
	// kube-proxy does.
	SourceRanges []netip.Prefix
	// GuardOnly: no portal, only the guard for ProxyPort (Port and IP are
	// ignored): a proxy socket listens in this family without a portal in
	// it (a dual-stack socket of a one-family Service, a socket of external
	// traffic without an external address yet), and must not be a back
	// door there either.
	GuardOnly bool
	// HealthCheck: no portal, only the accept of a Service's
	// healthCheckNodePort (Port; always TCP, IP and proxy ports ignored)
	// in KUBE-NODEPORT-NON-LOCAL. Its health server listens on the node
	// port itself, where NodePorts answer: on a node whose INPUT policy
	// drops, nothing else lets a load balancer's check in, as kube-proxy's
	// rule in KUBE-NODEPORTS does.
	HealthCheck bool
}
