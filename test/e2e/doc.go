// Package e2e proves kube-userspace-proxy on a real kernel: the tests build
// the binary, create a one-node cluster of network namespaces
// (test/harness/netns), start backend processes and the proxy with
// --manifests, and drive TCP and UDP traffic through ClusterIPs, NodePorts,
// externalIPs and LoadBalancer ingress IPs, from pods, from the node itself
// and from an external host. TestFaults declares faults (issue 8) in Services'
// annotations and measures them through the ClusterIPs. TestFlood (skipped
// with -short) floods one Service with 20,000 UDP sources and 5,000
// half-open TCP clients and times a second Service meanwhile.
//
// The suite needs root, `ip` and `iptables`; otherwise every test skips with
// a message saying so. Run it with:
//
//	go test -count=1 -v ./test/e2e
//
// The figures a closing note needs (distribution counts, affinity trial
// counts, re-pin result, update latency) are printed with t.Logf as lines
// starting with "FIGURE".
package e2e
