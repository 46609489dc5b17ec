package config

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

const svcHead = `apiVersion: v1
kind: Service
metadata:
  name: web
spec:
`

func TestDecodeManifests(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		objects int
		wantErr string // substring of the only error; "" for none
	}{
		{"service defaults namespace", svcHead + "  ports: [{port: 80}]\n", 1, ""},
		{"port out of range", svcHead + "  ports: [{port: 70000}]\n", 0,
			"svc.yaml: Service default/web: spec.ports[0].port: 70000 is out of range 1-65535"},
		{"unknown field is strict", svcHead + "  ports: [{port: 80, prot: TCP}]\n", 0,
			`svc.yaml: Service default/web: unknown field "spec.ports[0].prot"`},
		// A misspelt field hid the object's other errors until it was
		// fixed: all are in the one report.
		{"unknown field and invalid values", svcHead + "  ports: [{name: a, port: 70000, prot: TCP}, {name: b, port: 80, protocol: HTTP}]\n  sessionAffinity: Sticky\n", 0,
			`svc.yaml: Service default/web: unknown field "spec.ports[0].prot"; spec.ports[0].port: 70000 is out of range 1-65535; ` +
				`spec.ports[0].targetPort: 70000 is out of range 1-65535; spec.ports[1].protocol: "HTTP" is not a valid protocol (TCP, UDP or SCTP); ` +
				`spec.sessionAffinity: "Sticky" is not valid (None or ClientIP)`},
		{"sctp port accepted, to be skipped", svcHead + "  ports: [{name: a, port: 80}, {name: b, port: 80, protocol: SCTP}]\n", 1, ""},
		{"slice with an sctp port accepted", strings.Replace(sliceYAML("web-1", "IPv4", "10.1.0.1"), "port: 8080", "port: 8080\n  protocol: SCTP", 1), 1, ""},
		{"bad protocol", svcHead + "  ports: [{port: 80, protocol: HTTP}]\n", 0, `"HTTP" is not a valid protocol`},
		{"bad cluster IP", svcHead + "  clusterIP: 10.0.0.300\n  ports: [{port: 80}]\n", 0,
			`spec.clusterIP: "10.0.0.300" is not a valid IP address`},
		{"headless needs no ports", svcHead + "  clusterIP: None\n", 1, ""},
		// As the API server refuses them: such a Service took its node
		// port on every node, where kube-proxy skips a headless Service.
		{"headless NodePort", svcHead + "  type: NodePort\n  clusterIP: None\n  ports: [{port: 80, nodePort: 30070}]\n", 0,
			`spec.clusterIP: "None" may not be set for a NodePort Service`},
		{"headless LoadBalancer", svcHead + "  type: LoadBalancer\n  clusterIP: None\n  ports: [{port: 80, nodePort: 30070}]\n", 0,
			`spec.clusterIP: "None" may not be set for a LoadBalancer Service`},
		{"bad max-connection-age", strings.Replace(svcHead, "metadata:\n", "metadata:\n  annotations: {kube-userspace-proxy/max-connection-age: 5x}\n", 1) + "  ports: [{port: 80}]\n", 0,
			`Service default/web: metadata.annotations[kube-userspace-proxy/max-connection-age]: "5x" is not a duration`},
		{"negative drain-removed", strings.Replace(svcHead, "metadata:\n", "metadata:\n  annotations: {kube-userspace-proxy/drain-removed: -1s}\n", 1) + "  ports: [{port: 80}]\n", 0,
			`metadata.annotations[kube-userspace-proxy/drain-removed]: "-1s" must not be negative`},
		{"dual stack", svcHead + "  clusterIPs: [10.0.0.1, 'fd00::1']\n  ports: [{port: 80}]\n", 1, ""},
		{"two IPv4 cluster IPs", svcHead + "  clusterIPs: [10.0.0.1, 10.0.0.2]\n  ports: [{port: 80}]\n", 0,
			"second address of the same IP family"},
		// As the API server refuses them: each was served, with the
		// families of its addresses rather than those the Service states.
		{"SingleStack with two cluster IPs", svcHead + "  ipFamilyPolicy: SingleStack\n  clusterIPs: [10.0.0.1, 'fd00::1']\n  ports: [{port: 80}]\n", 0,
			`spec.ipFamilyPolicy: SingleStack, but spec.clusterIPs holds two addresses (RequireDualStack or PreferDualStack serves both)`},
		{"SingleStack with two families", svcHead + "  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv4, IPv6]\n  ports: [{port: 80}]\n", 0,
			`spec.ipFamilyPolicy: SingleStack, but spec.ipFamilies lists two (RequireDualStack or PreferDualStack serves both)`},
		{"ipFamilies disagree with the cluster IP", svcHead + "  ipFamilies: [IPv6]\n  clusterIP: 10.96.2.6\n  ports: [{port: 80}]\n", 0,
			`spec.clusterIP: "10.96.2.6" is not an IPv6 address, as spec.ipFamilies[0] says`},
		{"ipFamilies disagree with the second cluster IP", svcHead + "  ipFamilyPolicy: PreferDualStack\n  ipFamilies: [IPv4, IPv4]\n  clusterIPs: [10.0.0.1, 'fd00::1']\n  ports: [{port: 80}]\n", 0,
			`spec.ipFamilies[1]: "IPv4" is listed twice`},
		{"ipFamilies agree", svcHead + "  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv6, IPv4]\n  clusterIPs: ['fd00::1', 10.0.0.1]\n  ports: [{port: 80}]\n", 1, ""},
		{"unknown IP family", svcHead + "  ipFamilies: [IPv5]\n  ports: [{port: 80}]\n", 0,
			`spec.ipFamilies[0]: "IPv5" is not a valid IP family (IPv4 or IPv6)`},
		{"unknown ipFamilyPolicy", svcHead + "  ipFamilyPolicy: DualStack\n  ports: [{port: 80}]\n", 0,
			`spec.ipFamilyPolicy: "DualStack" is not a valid policy (SingleStack, PreferDualStack or RequireDualStack)`},
		{"IPv4-mapped cluster IP", svcHead + "  clusterIP: '::ffff:10.96.2.6'\n  ports: [{port: 80}]\n", 0,
			`spec.clusterIP: "::ffff:10.96.2.6" is an IPv4-mapped IPv6 address (write 10.96.2.6)`},
		{"IPv4-mapped cluster IP, the file's other objects kept", svcHead + "  clusterIP: '::ffff:10.96.2.6'\n  ports: [{port: 80}]\n---\n" + sliceYAML("web-1", "IPv4", "10.1.0.1"), 1,
			`Service default/web: spec.clusterIP: "::ffff:10.96.2.6" is an IPv4-mapped IPv6 address`},
		{"bad external IP", svcHead + "  externalIPs: [nope]\n  ports: [{port: 80}]\n", 0,
			`spec.externalIPs[0]: "nope" is not a valid IP address`},
		{"external IP", svcHead + "  externalIPs: [192.0.2.10, '2001:db8::10']\n  ports: [{port: 80}]\n", 1, ""},
		{"loopback external IP", svcHead + "  externalIPs: [127.0.0.1]\n  ports: [{port: 80}]\n", 0,
			`svc.yaml: Service default/web: spec.externalIPs[0]: "127.0.0.1" must not be in the loopback range (127.0.0.0/8, ::1/128)`},
		{"loopback external IP, IPv6", svcHead + "  externalIPs: [192.0.2.10, '::1']\n  ports: [{port: 80}]\n", 0,
			`spec.externalIPs[1]: "::1" must not be in the loopback range`},
		// The API server refuses an IPv4-mapped address (strict IP
		// validation, on by default since Kubernetes 1.36) before any other
		// check: served, it was IPv4 to the proxy and IPv6 to whatever else
		// reads the object, as a mapped clusterIP.
		{"loopback external IP, IPv4-mapped", svcHead + "  externalIPs: ['::ffff:127.0.0.2']\n  ports: [{port: 80}]\n", 0,
			`spec.externalIPs[0]: "::ffff:127.0.0.2" is an IPv4-mapped IPv6 address (write 127.0.0.2)`},
		{"IPv4-mapped external IP", svcHead + "  externalIPs: [192.0.2.10, '::ffff:192.0.2.11']\n  ports: [{port: 80}]\n", 0,
			`spec.externalIPs[1]: "::ffff:192.0.2.11" is an IPv4-mapped IPv6 address (write 192.0.2.11)`},
		{"IPv4-mapped LB ingress", svcHead + "  type: LoadBalancer\n  ports: [{port: 80}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: '::ffff:192.0.2.1'}]\n", 0,
			`status.loadBalancer.ingress[0].ip: "::ffff:192.0.2.1" is an IPv4-mapped IPv6 address (write 192.0.2.1)`},
		{"IPv4-mapped source range", svcHead + "  type: LoadBalancer\n  loadBalancerSourceRanges: ['::ffff:10.0.0.0/104']\n  ports: [{port: 80}]\n", 0,
			`spec.loadBalancerSourceRanges[0]: "::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 range (write 10.0.0.0/8)`},
		{"unspecified external IP", svcHead + "  externalIPs: [0.0.0.0]\n  ports: [{port: 80}]\n", 0,
			`spec.externalIPs[0]: "0.0.0.0" must not be unspecified`},
		{"unspecified external IP, IPv6", svcHead + "  externalIPs: ['::']\n  ports: [{port: 80}]\n", 0,
			`spec.externalIPs[0]: "::" must not be unspecified`},
		{"link-local external IP", svcHead + "  externalIPs: [169.254.169.254]\n  ports: [{port: 80}]\n", 0,
			`spec.externalIPs[0]: "169.254.169.254" must not be in the link-local range (169.254.0.0/16, fe80::/10)`},
		{"link-local external IP, IPv6", svcHead + "  externalIPs: ['fe80::1']\n  ports: [{port: 80}]\n", 0,
			`spec.externalIPs[0]: "fe80::1" must not be in the link-local range`},
		{"link-local multicast external IP", svcHead + "  externalIPs: [224.0.0.251]\n  ports: [{port: 80}]\n", 0,
			`spec.externalIPs[0]: "224.0.0.251" must not be in the link-local multicast range (224.0.0.0/24, ff02::/16)`},
		{"link-local multicast external IP, IPv6", svcHead + "  externalIPs: ['ff02::fb']\n  ports: [{port: 80}]\n", 0,
			`spec.externalIPs[0]: "ff02::fb" must not be in the link-local multicast range`},
		{"other multicast external IP: the API server takes it", svcHead + "  externalIPs: [239.1.2.3]\n  ports: [{port: 80}]\n", 1, ""},
		// Served, each captured the node's own traffic to that address (a
		// real API server takes such ingress IPs through the status).
		{"loopback LB ingress", svcHead + "  type: LoadBalancer\n  ports: [{port: 80}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 127.0.0.1}]\n", 0,
			`status.loadBalancer.ingress[0].ip: "127.0.0.1" must not be in the loopback range (127.0.0.0/8, ::1/128)`},
		{"link-local LB ingress", svcHead + "  type: LoadBalancer\n  ports: [{port: 80}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 192.0.2.1}, {ip: 169.254.169.254}]\n", 0,
			`status.loadBalancer.ingress[1].ip: "169.254.169.254" must not be in the link-local range`},
		{"unspecified LB ingress, IPv6", svcHead + "  type: LoadBalancer\n  ports: [{port: 80}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: '::'}]\n", 0,
			`status.loadBalancer.ingress[0].ip: "::" must not be unspecified`},
		{"loopback cluster IP", svcHead + "  clusterIP: 127.0.0.8\n  ports: [{port: 80}]\n", 0,
			`spec.clusterIP: "127.0.0.8" must not be in the loopback range (127.0.0.0/8, ::1/128)`},
		{"link-local second cluster IP", svcHead + "  clusterIPs: [10.0.0.1, 'fe80::1']\n  ports: [{port: 80}]\n", 0,
			`spec.clusterIPs[1]: "fe80::1" must not be in the link-local range`},
		{"bad LB ingress", svcHead + "  type: LoadBalancer\n  ports: [{port: 80}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 1.2.3}]\n", 0,
			`status.loadBalancer.ingress[0].ip: "1.2.3" is not a valid IP address`},
		{"LB ingress ipModes", svcHead + "  type: LoadBalancer\n  ports: [{port: 80}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 192.0.2.1, ipMode: VIP}, {ip: 192.0.2.2, ipMode: Proxy}, {ip: 192.0.2.3}]\n", 1, ""},
		// As the API server refuses them: an ipMode the proxy does not know
		// gets no portal (kube-proxy's IsVIPMode), so a typo lost the LB IP
		// without a word.
		{"unknown LB ingress ipMode", svcHead + "  type: LoadBalancer\n  ports: [{port: 80}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 192.0.2.1, ipMode: Vip}]\n", 0,
			`status.loadBalancer.ingress[0].ipMode: "Vip" is not valid (VIP or Proxy)`},
		{"LB ingress ipMode without ip", svcHead + "  type: LoadBalancer\n  ports: [{port: 80}]\nstatus:\n  loadBalancer:\n    ingress: [{hostname: lb.example.com, ipMode: Proxy}]\n", 0,
			"status.loadBalancer.ingress[0].ipMode: may only be set with an ip"},
		{"trafficDistribution", svcHead + "  trafficDistribution: PreferClose\n  ports: [{port: 80}]\n", 1, ""},
		{"unknown trafficDistribution", svcHead + "  trafficDistribution: PreferNear\n  ports: [{port: 80}]\n", 0,
			`spec.trafficDistribution: "PreferNear" is not valid (PreferClose, PreferSameZone or PreferSameNode)`},
		{"health check node port", svcHead + "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 30999\n  ports: [{port: 80, nodePort: 30080}]\n", 1, ""},
		{"health check node port is a node port", svcHead + "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 30080\n  ports: [{port: 80, nodePort: 30080}]\n", 0,
			"spec.healthCheckNodePort: 30080 is also spec.ports[0].nodePort"},
		// As the API server refuses it: served, port 22 was opened in a
		// drop-policy node's firewall for any host.
		{"health check node port out of the node port range", svcHead + "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 22\n  ports: [{port: 80, nodePort: 30080}]\n", 0,
			"spec.healthCheckNodePort: 22 is out of the node port range 30000-32767"},
		// As the API server refuses them (validateServiceExternalTrafficPolicy):
		// only a LoadBalancer with externalTrafficPolicy Local has a health
		// check; served, the port was claimed and nothing answered on it.
		{"health check node port on a NodePort", svcHead + "  type: NodePort\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 30999\n  ports: [{port: 80, nodePort: 30080}]\n", 0,
			"spec.healthCheckNodePort: may only be set when type is LoadBalancer and externalTrafficPolicy is Local"},
		{"health check node port under externalTrafficPolicy Cluster", svcHead + "  type: LoadBalancer\n  healthCheckNodePort: 30999\n  ports: [{port: 80, nodePort: 30080}]\n", 0,
			"spec.healthCheckNodePort: may only be set when type is LoadBalancer and externalTrafficPolicy is Local"},
		// As the API server refuses it (validateServiceExternalTrafficPolicy):
		// a ClusterIP Service without externalIPs has no external traffic,
		// and the policy, accepted, did nothing, where its author may have
		// meant internalTrafficPolicy.
		{"externalTrafficPolicy Local on a ClusterIP", svcHead + "  externalTrafficPolicy: Local\n  ports: [{port: 80}]\n", 0,
			`svc.yaml: Service default/web: spec.externalTrafficPolicy: "Local" may only be set for externally-accessible Services (type NodePort or LoadBalancer, or with externalIPs), as the API server refuses it (internalTrafficPolicy: Local keeps cluster IP traffic on the node)`},
		{"externalTrafficPolicy Cluster on a ClusterIP", svcHead + "  externalTrafficPolicy: Cluster\n  ports: [{port: 80}]\n", 0,
			`spec.externalTrafficPolicy: "Cluster" may only be set for externally-accessible Services`},
		{"externalTrafficPolicy Local on a ClusterIP with externalIPs", svcHead + "  externalTrafficPolicy: Local\n  externalIPs: [192.0.2.7]\n  ports: [{port: 80}]\n", 1, ""},
		{"externalTrafficPolicy Local on a NodePort", svcHead + "  type: NodePort\n  externalTrafficPolicy: Local\n  ports: [{port: 80, nodePort: 30080}]\n", 1, ""},
		{"source ranges", svcHead + "  type: LoadBalancer\n  loadBalancerSourceRanges: [10.0.0.0/8, ' fd00::/64 ']\n  ports: [{port: 80}]\n", 1, ""},
		{"bad source range", svcHead + "  type: LoadBalancer\n  loadBalancerSourceRanges: [10.0.0.0/8, 10.1.2.3]\n  ports: [{port: 80}]\n", 0,
			`spec.loadBalancerSourceRanges[1]: "10.1.2.3" is not a valid IP range`},
		{"source ranges on a ClusterIP", svcHead + "  loadBalancerSourceRanges: [10.0.0.0/8]\n  ports: [{port: 80}]\n", 0,
			"spec.loadBalancerSourceRanges: may only be used when type is LoadBalancer"},
		{"nodePort in range", svcHead + "  type: NodePort\n  ports: [{port: 80, nodePort: 30080}]\n", 1, ""},
		{"nodePort out of range", svcHead + "  type: NodePort\n  ports: [{port: 80, nodePort: 80}]\n", 0,
			"spec.ports[0].nodePort: 80 is out of the node port range 30000-32767"},
		{"port listed twice", svcHead + "  ports: [{name: a, port: 80}, {name: b, port: 80, protocol: TCP}]\n", 0,
			"svc.yaml: Service default/web: spec.ports[1]: port 80/TCP is listed twice"},
		{"port twice, TCP and UDP", svcHead + "  ports: [{name: a, port: 53}, {name: b, port: 53, protocol: UDP}]\n", 1, ""},
		{"nodePort listed twice", svcHead + "  type: NodePort\n  ports: [{name: a, port: 80, nodePort: 30080}, {name: b, port: 81, nodePort: 30080}]\n", 0,
			"svc.yaml: Service default/web: spec.ports[1].nodePort: node port 30080/TCP is listed twice"},
		{"nodePort twice on a LoadBalancer", svcHead + "  type: LoadBalancer\n  ports: [{name: a, port: 80, nodePort: 30080, protocol: UDP}, {name: b, port: 81, nodePort: 30081}, {name: c, port: 82, nodePort: 30080, protocol: UDP}]\n", 0,
			"spec.ports[2].nodePort: node port 30080/UDP is listed twice"},
		{"nodePort for TCP and UDP", svcHead + "  type: NodePort\n  ports: [{name: a, port: 53, nodePort: 30053}, {name: b, port: 53, nodePort: 30053, protocol: UDP}]\n", 1, ""},
		{"nodePort required", svcHead + "  type: NodePort\n  ports: [{port: 80}]\n", 0, "spec.ports[0].nodePort: is required"},
		{"nodePort on ClusterIP", svcHead + "  ports: [{port: 80, nodePort: 30080}]\n", 0, "may only be set for type NodePort"},
		{"affinity timeout ok", svcHead + "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 3}}\n  ports: [{port: 80}]\n", 1, ""},
		{"affinity timeout too big", svcHead + "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 86401}}\n  ports: [{port: 80}]\n", 0,
			"spec.sessionAffinityConfig.clientIP.timeoutSeconds: 86401 is out of range 1-86400"},
		{"affinity timeout zero", svcHead + "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}\n  ports: [{port: 80}]\n", 0,
			"0 is out of range 1-86400"},
		{"bad affinity", svcHead + "  sessionAffinity: Cookie\n  ports: [{port: 80}]\n", 0, `spec.sessionAffinity: "Cookie" is not valid`},
		{"unnamed ports", svcHead + "  ports: [{port: 80}, {port: 81}]\n", 0, "spec.ports[0].name: is required"},
		{"bad name", "apiVersion: v1\nkind: Service\nmetadata: {name: Web_1}\nspec: {ports: [{port: 80}]}\n", 0, "metadata.name"},
		{"missing name", "apiVersion: v1\nkind: Service\nspec: {ports: [{port: 80}]}\n", 0, "metadata.name is required"},
		{"wrong apiVersion", "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: x}\n", 0, "apiVersion"},
		{"unknown kind skipped", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {}\n", 0, ""},
		{"other core kinds skipped", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", 0, ""},
		{"a kind two letters from Service skipped", "apiVersion: example.com/v1\nkind: Device\nmetadata: {name: x}\n", 0, ""},
		{"misspelt kind", "apiVersion: v1\nkind: Servce\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n", 0,
			`svc.yaml: document 1 (line 1): kind "Servce" is not one the proxy reads: did you mean "Service"? (metadata.name web)`},
		{"swapped letters", "apiVersion: v1\nkind: Servcie\nmetadata: {name: web}\n", 0, `did you mean "Service"?`},
		{"kind in lower case", "apiVersion: v1\nkind: service\nmetadata: {name: web}\n", 0,
			`kind "service": kinds are case-sensitive: did you mean "Service"?`},
		{"plural kind", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlices\nmetadata: {name: web-1}\n", 0, `did you mean "EndpointSlice"?`},
		{"singular Endpoints", "apiVersion: v1\nkind: Endpoint\nmetadata: {name: web}\n", 0, `did you mean "Endpoints"?`},
		{"other discovery kind", "apiVersion: discovery.k8s.io/v1\nkind: Slice\nmetadata: {name: web-1}\n", 0,
			`kind "Slice" is not in discovery.k8s.io/v1: did you mean "EndpointSlice"?`},
		{"no apiVersion", "kind: Thing\nmetadata: {name: x}\n", 0, `document 1 (line 1): kind "Thing" has no apiVersion`},
		{"Service of another group", "apiVersion: apps/v1\nkind: Service\nmetadata: {name: web}\n", 0,
			`svc.yaml: Service default/web: apiVersion "apps/v1" is not supported for Service, use "v1"`},
		{"typed list of other kinds skipped", "apiVersion: v1\nkind: PodList\nitems:\n- metadata: {name: a}\n", 0, ""},
		{"no kind", "metadata: {name: x}\n", 0, "document 1 (line 1): object has no kind"},
		{"yaml syntax", "apiVersion: v1\nkind: [\n", 0, "document 1 (line 1)"},
		{"yaml syntax: the file's line", svcHead + "  ports: [{port: 80}]\n---\n# b\napiVersion: v1\nkind: Service\nmetadata:\n  name: b\n bad: x\n  x: y\n", 1,
			"svc.yaml: document 2 (line 8): line 12: did not find expected key"},
		{"port as a string", svcHead + "  ports: [{port: \"80\"}]\n", 0, `svc.yaml: Service default/web: spec.ports[0].port: must be a whole number, not the string "80"`},
		{"protocol as a number", svcHead + "  ports: [{name: a, port: 80}, {name: b, port: 81, protocol: 5}]\n", 0,
			"spec.ports[1].protocol: must be a string, not the number 5"},
		{"annotation as a number", "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations: {a: x, prometheus.io/port: 8080}\nspec: {ports: [{port: 80}]}\n", 0,
			`metadata.annotations["prometheus.io/port"]: must be a string, not the number 8080`},
		{"selector as a list", svcHead + "  selector: [a, b]\n  ports: [{port: 80}]\n", 0, `spec.selector: must be an object, not the list ["a","b"]`},
		{"port as a number in a list of objects", svcHead + "  ports: [80]\n", 0, `spec.ports[0]: must be an object, not the number 80`},
		{"ready as a string", strings.Replace(sliceYAML("web-1", "IPv4", "10.1.0.1"), `addresses: ["10.1.0.1"]`, `addresses: ["10.1.0.1"]`+"\n  conditions: {ready: \"yes\"}", 1), 0,
			`endpoints[0].conditions.ready: must be true or false, not the string "yes"`},
		{"labels as a bool", "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  labels: {enabled: true}\nspec: {ports: [{port: 80}]}\n", 0,
			`metadata.labels["enabled"]: must be a string, not the boolean true`},
		{"comments only", "# nothing\n---\n# here\n", 0, ""},
		{"multi document", svcHead + "  ports: [{port: 80}]\n---\n" + sliceYAML("web-1", "IPv4", "10.1.0.1") + "--- # end\n", 2, ""},
		{"slice wrong family", sliceYAML("web-1", "IPv4", "fd00::1"), 0, `endpoints[0].addresses[0]: "fd00::1" is not an IPv4 address`},
		{"slice bad address", sliceYAML("web-1", "IPv6", "zz"), 0, `"zz" is not a valid IP address`},
		// Refused in slices of either type, as the API server refuses it;
		// an IPv6 slice's was served as an IPv4 endpoint, an IPv4 slice's
		// was called "not an IPv4 address".
		{"slice IPv4-mapped address, IPv6", sliceYAML("web-1", "IPv6", "::ffff:10.1.0.1"), 0,
			`endpoints[0].addresses[0]: "::ffff:10.1.0.1" is an IPv4-mapped IPv6 address (write 10.1.0.1)`},
		{"slice IPv4-mapped address, IPv4", sliceYAML("web-1", "IPv4", "::ffff:10.1.0.1"), 0,
			`endpoints[0].addresses[0]: "::ffff:10.1.0.1" is an IPv4-mapped IPv6 address (write 10.1.0.1)`},
		{"endpoints IPv4-mapped address", strings.Replace(endpointsYAML, "10.1.0.9", "'::ffff:10.1.0.9'", 1), 0,
			`Endpoints default/web: subsets[0].notReadyAddresses[0].ip: "::ffff:10.1.0.9" is an IPv4-mapped IPv6 address (write 10.1.0.9)`},
		{"slice FQDN: valid, ignored by the proxier", sliceYAML("web-1", "FQDN", "example.com"), 1, ""},
		{"slice nodeName in upper case", strings.Replace(sliceYAML("web-1", "IPv4", "10.1.0.1"), `addresses: ["10.1.0.1"]`, `addresses: ["10.1.0.1"]`+"\n  nodeName: Node-A", 1), 0,
			`endpoints[0].nodeName: "Node-A": a lowercase RFC 1123 subdomain`},
		{"slice nodeName", strings.Replace(sliceYAML("web-1", "IPv4", "10.1.0.1"), `addresses: ["10.1.0.1"]`, `addresses: ["10.1.0.1"]`+"\n  nodeName: node-a.example", 1), 1, ""},
		{"slice bad addressType", sliceYAML("web-1", "IPX", "10.1.0.1"), 0, `addressType: "IPX" is not valid`},
		{"slice no service label", strings.Replace(sliceYAML("web-1", "IPv4", "10.1.0.1"), "kubernetes.io/service-name", "app", 1), 0,
			"metadata.labels[kubernetes.io/service-name]: is required"},
		{"slice bad port", strings.Replace(sliceYAML("web-1", "IPv4", "10.1.0.1"), "port: 8080", "port: 0", 1), 0,
			"ports[0].port: 0 is out of range 1-65535"},
		{"endpoints", endpointsYAML, 1, ""},
		{"endpoints bad ip", strings.Replace(endpointsYAML, "10.1.0.9", "10.1.0", 1), 0,
			`Endpoints default/web: subsets[0].notReadyAddresses[0].ip: "10.1.0" is not a valid IP address`},
		// As the API server checks it (and a slice converted from it would
		// be invalid: FuzzEndpointsConversion found "nodT").
		{"endpoints nodeName in upper case", strings.Replace(endpointsYAML, "  - ip: 10.1.0.9", "  - ip: 10.1.0.9\n    nodeName: nodT", 1), 0,
			`Endpoints default/web: subsets[0].notReadyAddresses[0].nodeName: "nodT": a lowercase RFC 1123 subdomain`},
		{"endpoints nodeName", strings.Replace(endpointsYAML, "  - ip: 10.1.0.1", "  - ip: 10.1.0.1\n    nodeName: node-a", 1), 1, ""},
		{"json list", `{"apiVersion":"v1","kind":"List","items":[` +
			`{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":80}]}},` +
			`{"apiVersion":"v1","kind":"Service","metadata":{"name":"b"},"spec":{"ports":[{"port":80}]}}]}`, 2, ""},
		{"typed list items without kind", "apiVersion: v1\nkind: ServiceList\nitems:\n- metadata: {name: a}\n  spec: {ports: [{port: 80}]}\n", 1, ""},
		{"yaml list", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a}\n  spec: {ports: [{port: 80}]}\n- " + strings.ReplaceAll(strings.TrimSuffix(sliceYAML("a-1", "IPv4", "10.1.0.1"), "\n"), "\n", "\n  ") + "\n", 2, ""},
		{"list in a list", `{"apiVersion":"v1","kind":"List","items":[` +
			`{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":80}]}},` +
			`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"b"},"spec":{"ports":[{"port":80}]}}]}]}`, 1,
			`svc.yaml: document 1 (line 1), items[1] (line 1): a List inside a List is not read: put its items in the outer list`},
		{"typed list in a list", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ServiceList\n  items: []\n", 0,
			`svc.yaml: document 1 (line 1), items[0] (line 4): a ServiceList inside a List is not read`},
		{"list in a typed list", "apiVersion: v1\nkind: ServiceList\nitems:\n- metadata: {name: a}\n  spec: {ports: [{port: 80}]}\n- kind: List\n  items: []\n", 1,
			`items[1] (line 6): a List inside a ServiceList is not read`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := DecodeManifests("svc.yaml", []byte(tc.data))
			if len(got) != tc.objects {
				t.Errorf("got %d objects, want %d (errors: %v)", len(got), tc.objects, errs)
			}
			switch {
			case tc.wantErr == "" && len(errs) > 0:
				t.Errorf("unexpected errors: %v", errs)
			case tc.wantErr != "" && len(errs) != 1:
				t.Errorf("got errors %v, want one containing %q", errs, tc.wantErr)
			case tc.wantErr != "" && !strings.Contains(errs[0].Error(), tc.wantErr):
				t.Errorf("error %q does not contain %q", errs[0], tc.wantErr)
			}
			for _, e := range errs {
				if strings.Contains(e.Error(), "\n") {
					t.Errorf("error spans lines: %q", e)
				}
			}
		})
	}
}

// A List nested 3,000 deep (81 KB) took 30 s of CPU to decode, each level
// parsing all that it held again, and held up every other manifest reload:
// the first List inside a List ends it with an error.
func TestDecodeManifestsDeepListNesting(t *testing.T) {
	const depth = 3000
	data := strings.Repeat(`{"apiVersion":"v1","kind":"List","items":[`, depth) + strings.Repeat("]}", depth)
	got, errs := DecodeManifests("deep.json", []byte(data))
	if len(got) != 0 || len(errs) != 1 {
		t.Fatalf("got %d objects and errors %v, want one error", len(got), errs)
	}
	if want := "deep.json: document 1 (line 1), items[0] (line 1): a List inside a List is not read"; !strings.Contains(errs[0].Error(), want) {
		t.Errorf("error %q does not contain %q", errs[0], want)
	}
}

// An object with thousands of invalid fields is one error of bounded
// length: its first failures and how many more. Every one was listed: a
// Service with 10,000 bad externalIPs (a 70 KB document) was a 588 KB log
// line at each change, and the 64 MiB a manifest file may hold made one of
// hundreds of MB.
func TestDecodeManifestsManyFieldErrorsBounded(t *testing.T) {
	const n = 10000
	bad := make([]string, n)
	for i := range bad {
		bad[i] = fmt.Sprintf("x%d", i)
	}
	data := svcHead + "  clusterIP: 10.96.0.61\n  ports:\n  - port: 80\n  externalIPs: [" + strings.Join(bad, ",") + "]\n"
	got, errs := DecodeManifests("many.yaml", []byte(data))
	if len(got) != 0 || len(errs) != 1 {
		t.Fatalf("got %d objects and errors %d, want one error", len(got), len(errs))
	}
	msg := errs[0].Error()
	for _, want := range []string{`spec.externalIPs[0]: "x0" is not a valid IP address; `,
		fmt.Sprintf(`spec.externalIPs[%d]: "x%d" is not a valid IP address`, maxFieldErrors-1, maxFieldErrors-1),
		fmt.Sprintf("; and %d more", n-maxFieldErrors)} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not contain %q: %.300s...", want, msg)
		}
	}
	if len(msg) > 2000 {
		t.Errorf("error of %d bytes for %d invalid fields", len(msg), n)
	}
}

func sliceYAML(name, addressType, addr string) string {
	return `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ` + name + `
  labels:
    kubernetes.io/service-name: web
addressType: ` + addressType + `
ports:
- port: 8080
endpoints:
- addresses: ["` + addr + `"]
`
}

const endpointsYAML = `apiVersion: v1
kind: Endpoints
metadata:
  name: web
subsets:
- addresses:
  - ip: 10.1.0.1
  - ip: fd00::1
  notReadyAddresses:
  - ip: 10.1.0.9
  ports:
  - port: 8080
`

func TestDecodeManifestsDefaults(t *testing.T) {
	data := svcHead + "  sessionAffinity: ClientIP\n  clusterIP: 10.0.0.1\n  ports: [{port: 80}]\n---\n" + sliceYAML("web-1", "IPv4", "10.1.0.1")
	got, errs := DecodeManifests("m.yaml", []byte(data))
	if len(errs) > 0 || len(got) != 2 {
		t.Fatalf("got %d objects, errors %v", len(got), errs)
	}
	svc := got[0].Object.(*v1.Service)
	if svc.Namespace != "default" || svc.Spec.Type != v1.ServiceTypeClusterIP || svc.Spec.Ports[0].Protocol != v1.ProtocolTCP ||
		svc.Spec.Ports[0].TargetPort.IntVal != 80 || *svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds != 10800 ||
		len(svc.Spec.ClusterIPs) != 1 {
		t.Errorf("service not defaulted: %+v", svc.Spec)
	}
	es := got[1].Object.(*discovery.EndpointSlice)
	c := es.Endpoints[0].Conditions
	if es.Namespace != "default" || *es.Ports[0].Protocol != v1.ProtocolTCP || !*c.Ready || !*c.Serving || *c.Terminating {
		t.Errorf("slice not defaulted: %+v", es)
	}
	if got[1].Doc != 2 || got[1].Line != 10 {
		t.Errorf("slice located at document %d line %d, want 2 and 10", got[1].Doc, got[1].Line)
	}
}

// An absent serving condition is true, whatever ready says, as the API
// documents and kube-proxy (and this proxy's informer path) read it: a
// terminating endpoint that is not ready and says nothing of serving is a
// fallback while no endpoint is ready. It was defaulted to ready, so a
// rollout in manifests dropped traffic where the API source kept it.
func TestDecodeManifestsServingDefaultsToTrue(t *testing.T) {
	data := `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- addresses: [10.1.0.1]
  conditions: {ready: false, terminating: true}
- addresses: [10.1.0.2]
  conditions: {ready: false, serving: false, terminating: true}
`
	got, errs := DecodeManifests("m.yaml", []byte(data))
	if len(errs) > 0 || len(got) != 1 {
		t.Fatalf("got %d objects, errors %v", len(got), errs)
	}
	es := got[0].Object.(*discovery.EndpointSlice)
	if c := es.Endpoints[0].Conditions; !*c.Serving || *c.Ready || !*c.Terminating {
		t.Errorf("absent serving: ready=%v serving=%v terminating=%v, want serving true (ready false, terminating true)", *c.Ready, *c.Serving, *c.Terminating)
	}
	if c := es.Endpoints[1].Conditions; *c.Serving {
		t.Error("serving: false given was defaulted to true")
	}
}

// Every stream shape kubectl accepts loads every object it holds: YAML
// documents (LF or CRLF), one JSON object, and a JSON stream of several
// objects one after another (with or without whitespace between them). A
// stream that breaks keeps what came before and reports where it broke.
func TestDecodeManifestStreams(t *testing.T) {
	svcJSON := func(name string) string {
		return `{"apiVersion":"v1","kind":"Service","metadata":{"name":"` + name + `"},"spec":{"ports":[{"port":80}]}}`
	}
	tests := []struct {
		name     string
		data     string
		names    []string
		wantLine []int
		wantErr  string
	}{
		{name: "yaml documents", data: serviceYAML("a", 80) + "---\n" + serviceYAML("b", 80), names: []string{"a", "b"}, wantLine: []int{1, 7}},
		{name: "yaml with CRLF", data: strings.ReplaceAll(serviceYAML("a", 80)+"---\n"+serviceYAML("b", 80), "\n", "\r\n"), names: []string{"a", "b"}},
		{name: "yaml leading separator and comment-only document", data: "---\n# nothing\n---\n" + serviceYAML("a", 80), names: []string{"a"}, wantLine: []int{4}},
		{name: "one json object", data: svcJSON("a") + "\n", names: []string{"a"}, wantLine: []int{1}},
		{name: "json stream, one per line", data: svcJSON("a") + "\n" + svcJSON("b") + "\n" + svcJSON("c") + "\n", names: []string{"a", "b", "c"}, wantLine: []int{1, 2, 3}},
		{name: "json stream, back to back", data: svcJSON("a") + svcJSON("b"), names: []string{"a", "b"}},
		{name: "json stream, indented", data: "{\n  \"apiVersion\": \"v1\", \"kind\": \"Service\",\n  \"metadata\": {\"name\": \"a\"},\n  \"spec\": {\"ports\": [{\"port\": 80}]}\n}\n" + svcJSON("b"), names: []string{"a", "b"}, wantLine: []int{1, 6}},
		{name: "json stream cut short", data: svcJSON("a") + "\n" + `{"apiVersion": "v1", "kind": `, names: []string{"a"}, wantErr: "svc.yaml: document 2"},
		// apimachinery's reader refuses the whole stream, as kubectl does.
		{name: "text after a separator", data: serviceYAML("a", 80) + "--- b\n" + serviceYAML("b", 80), wantErr: "svc.yaml: document 1: invalid Yaml document separator: b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := DecodeManifests("svc.yaml", []byte(tc.data))
			var names []string
			var lines []int
			for _, m := range got {
				names = append(names, m.Name)
				lines = append(lines, m.Line)
			}
			if strings.Join(names, ",") != strings.Join(tc.names, ",") {
				t.Errorf("loaded %v, want %v (errors %v)", names, tc.names, errs)
			}
			if tc.wantLine != nil && fmt.Sprint(lines) != fmt.Sprint(tc.wantLine) {
				t.Errorf("lines %v, want %v", lines, tc.wantLine)
			}
			switch {
			case tc.wantErr == "" && len(errs) > 0:
				t.Errorf("unexpected errors: %v", errs)
			case tc.wantErr != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.wantErr)):
				t.Errorf("errors %v, want one containing %q", errs, tc.wantErr)
			}
		})
	}
}

// An error in an item of a List names the item and its line: the second
// item's misspelt kind was reported as "document 1 (line 1)", the List's
// own place, which left the reader to find the item.
func TestDecodeManifestsListItemErrors(t *testing.T) {
	const service = "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 80}]}\n"
	const yamlList = "apiVersion: v1\nkind: List\nitems:\n" +
		"- apiVersion: v1\n  kind: Service\n  metadata: {name: a}\n  spec: {ports: [{port: 80}]}\n" +
		"- apiVersion: v1\n  kind: Servce\n  metadata: {name: b}\n  spec: {ports: [{port: 80}]}\n"
	tests := []struct {
		name    string
		data    string
		objects int
		want    string // the one error starts with it
	}{
		{"misspelt kind in a YAML List", yamlList, 1,
			`svc.yaml: document 1 (line 1), items[1] (line 8): kind "Servce" is not one the proxy reads`},
		{"the List as the second document", service + "---\n" + yamlList, 2,
			`svc.yaml: document 2 (line 6), items[1] (line 13): kind "Servce"`},
		{"item without kind in a List", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  metadata: {name: a}\n", 0,
			`svc.yaml: document 1 (line 1), items[0] (line 4): object has no kind`},
		{"JSON List on one line", `{"apiVersion":"v1","kind":"List","items":[` +
			`{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":80}]}},` +
			`{"apiVersion":"v1","kind":"Servce","metadata":{"name":"b"}}]}`, 1,
			`svc.yaml: document 1 (line 1), items[1] (line 1): kind "Servce"`},
		{"indented JSON List", "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"List\",\n  \"items\": [\n" +
			"    {\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"a\"}, \"spec\": {\"ports\": [{\"port\": 80}]}},\n" +
			"    {\"apiVersion\": \"v1\", \"kind\": \"Servce\", \"metadata\": {\"name\": \"b\"}}\n  ]\n}\n", 1,
			`svc.yaml: document 1 (line 1), items[1] (line 6): kind "Servce"`},
		{"List inside a List", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a}\n  spec: {ports: [{port: 80}]}\n" +
			"- apiVersion: v1\n  kind: List\n  items: []\n", 1,
			`svc.yaml: document 1 (line 1), items[1] (line 8): a List inside a List is not read: put its items in the outer list`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := DecodeManifests("svc.yaml", []byte(tc.data))
			if len(got) != tc.objects {
				t.Errorf("got %d objects, want %d (errors: %v)", len(got), tc.objects, errs)
			}
			if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), tc.want) {
				t.Errorf("got errors %q, want one starting %q", errs, tc.want)
			}
		})
	}
}

// An invalid value is quoted by a bounded prefix and its length, not
// whole: a 300 KB value (a lifetime annotation, which the API server takes
// up to 256 KiB, or a manifest line) was copied whole into the log line,
// /debug/services and explain's output.
func TestDecodeManifestsErrorsQuoteBoundedValues(t *testing.T) {
	big := strings.Repeat("5", 30000)
	for _, tc := range []struct{ name, data string }{
		{"lifetime annotation", strings.Replace(svcHead, "  name: web\n", "  name: web\n  annotations:\n    kube-userspace-proxy/max-connection-age: \""+big+"\"\n", 1) + "  ports: [{port: 80}]\n"},
		{"negative lifetime", strings.Replace(svcHead, "  name: web\n", "  name: web\n  annotations:\n    kube-userspace-proxy/drain-removed: \"-"+big+"s\"\n", 1) + "  ports: [{port: 80}]\n"},
		{"externalIP", svcHead + "  ports: [{port: 80}]\n  externalIPs: [\"" + big + "\"]\n"},
		{"type", svcHead + "  type: \"" + big + "\"\n  ports: [{port: 80}]\n"},
		{"protocol", svcHead + "  ports: [{port: 80, protocol: \"" + big + "\"}]\n"},
		{"port name", svcHead + "  ports: [{name: \"" + big + "\", port: 80}]\n"},
		{"targetPort name", svcHead + "  ports: [{port: 80, targetPort: \"" + big + "\"}]\n"},
		{"object name", strings.Replace(svcHead, "name: web", "name: \""+big+"\"", 1) + "  ports: [{port: 80}]\n"},
		{"kind", strings.Replace(sliceYAML("web-1", "IPv4", "10.1.0.1"), "kind: EndpointSlice", "kind: \"Slice"+big+"\"", 1)},
		{"apiVersion", strings.Replace(svcHead, "apiVersion: v1", "apiVersion: \"v"+big+"\"", 1)},
		// YAML's simple keys stop at 1024 characters; explicit ones do not.
		{"unknown field", svcHead + "  ports: [{port: 80}]\n  ? \"" + big + "\"\n  : 1\n"},
		{"a string for a number", svcHead + "  ports: [{port: \"" + big + "\"}]\n"},
		{"timestamp", strings.Replace(svcHead, "  name: web\n", "  name: web\n  creationTimestamp: \""+big+"\"\n", 1) + "  ports: [{port: 80}]\n"},
		{"duplicate key", svcHead + "  ports: [{port: 80}]\n  ? \"" + big + "\"\n  : 1\n  ? \"" + big + "\"\n  : 2\n"},
		{"slice address", strings.Replace(sliceYAML("web-1", "IPv4", "10.1.0.1"), "10.1.0.1", big, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := DecodeManifests("svc.yaml", []byte(tc.data))
			if len(got) != 0 || len(errs) != 1 {
				t.Fatalf("got %d objects and errors %v, want one error", len(got), len(errs))
			}
			if msg := errs[0].Error(); len(msg) > 1000 || !strings.Contains(msg, " bytes)") {
				t.Errorf("error of %d bytes, want at most 1000 naming the value's length: %.300s", len(msg), msg)
			}
		})
	}
}

// A document holding more values than maxDocumentValues is refused before
// it is decoded, naming the file and the document, and the file keeps its
// previous objects. The 64 MiB bound is on the bytes read: a document of
// tiny values (`1,`) decodes into about 100 times its size (8 MiB: 852 MB,
// 11 s; 64 MiB: more than 4 GB, the proxy's OOM).
func TestDecodeManifestsDocumentValuesBounded(t *testing.T) {
	defer func(v int) { maxDocumentValues = v }(maxDocumentValues)
	maxDocumentValues = 1000
	web := svcHead + "  clusterIP: 10.96.0.61\n  ports: [{port: 80}]\n"
	big := strings.Replace(svcHead, "name: web", "name: big", 1) + "  ports: [{port: 80}]\n  x: [" + strings.Repeat("1,", 1000) + "1]\n"
	got, errs := DecodeManifests("big.yaml", []byte(web+"---\n"+big))
	if len(got) != 1 || len(errs) != 1 {
		t.Fatalf("got %d objects and errors %v, want web and one error", len(got), errs)
	}
	if want := "big.yaml: document 2 (line 9): holds more than 1000 values"; !strings.HasPrefix(errs[0].Error(), want) {
		t.Errorf("error %q, want it to start %q", errs[0], want)
	}
	// The file's last good objects stay served.
	d := decoder{nodePorts: DefaultNodePortRange}
	prev, errs := d.applyFile("f.yaml", []byte(web), nil)
	if len(errs) != 0 || len(prev.objects) != 1 {
		t.Fatalf("first version: %d objects, errors %v", len(prev.objects), errs)
	}
	next, errs := d.applyFile("f.yaml", []byte(big), prev)
	if len(errs) != 1 || len(next.objects) != 1 || next.objects[0].key.Name != "web" {
		t.Errorf("after the document past the bound: objects %v, errors %v; want web kept", next.objects, errs)
	}
}

// The bound takes a kubectl List of 20,000 Services and their slices
// (counted, not decoded).
func TestDocumentValuesBoundTakesLargeLists(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: List\nitems:\n")
	for i := range 20000 {
		fmt.Fprintf(&b, "- apiVersion: v1\n  kind: Service\n  metadata:\n    name: svc-%d\n    namespace: ns-%d\n    labels: {app: svc-%d}\n  spec:\n"+
			"    type: ClusterIP\n    clusterIP: 10.100.%d.%d\n    clusterIPs: [10.100.%d.%d]\n    ipFamilies: [IPv4]\n    ipFamilyPolicy: SingleStack\n"+
			"    sessionAffinity: None\n    internalTrafficPolicy: Cluster\n    selector: {app: svc-%d}\n    ports:\n    - {name: http, port: 80, protocol: TCP, targetPort: 8080}\n",
			i, i/1000, i, i/250%250, i%250+1, i/250%250, i%250+1, i)
		fmt.Fprintf(&b, "- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n  metadata:\n    name: svc-%d-abcde\n    namespace: ns-%d\n"+
			"    labels: {kubernetes.io/service-name: svc-%d, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}\n"+
			"  addressType: IPv4\n  ports:\n  - {name: http, port: 8080, protocol: TCP}\n  endpoints:\n", i, i/1000, i)
		for j := range 3 {
			fmt.Fprintf(&b, "  - addresses: [10.200.%d.%d]\n    conditions: {ready: true, serving: true, terminating: false}\n    nodeName: node-%d\n"+
				"    targetRef: {kind: Pod, name: svc-%d-pod-%d, namespace: ns-%d}\n", (i*3+j)/250%250, (i*3+j)%250+1, j, i, j, i/1000)
		}
	}
	if n, over := tooManyValues([]byte(b.String())); over {
		t.Errorf("a List of 20,000 Services and slices (%d bytes) counts %d values, past the bound %d", b.Len(), n, maxDocumentValues)
	}
}
