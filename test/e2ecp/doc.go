// Package e2ecp is the end-to-end suite of the API-server source (issue 4): the real
// kube-userspace-proxy binary runs in the node namespace of a test/harness/netns lab,
// watching a real etcd + kube-apiserver (test/controlplane) that runs on the same
// namespace's loopback, authenticated with the kube-userspace-proxy service account
// token after examples/deploy's ClusterRole and binding are applied — never as admin.
//
// The tests create Services and EndpointSlices with client-go and check what pods and
// external hosts see through the ClusterIP: how fast a new Service is served, that Service
// changes (port, affinity timeout, externalIPs) and deletions reach the rules, that a
// Service's faults annotation (issue 8) reaches its traffic live and an invalid one is
// logged while the last valid faults keep applying, that a rolling update of 20
// endpoints fails no connection, that an API-server outage and an etcd outage
// (TestEtcdOutage) neither interrupt existing Services nor fail /healthz, and that a
// connection to the API server that died unnoticed is replaced within seconds
// (TestWatchConnectionLost; TestWatchConnectionLostHTTP1 without HTTP/2's health check).
//
// Backends are in-process servers listening inside the lab's backends namespace, so a
// test can close one gracefully, as a terminating pod would. The suite needs root and
// the control-plane binaries (test/controlplane/build.sh); it skips with a message saying
// which is missing. Everything it creates — namespaces, processes, rules — goes away when
// the test ends, failed or not.
//
// Run it as root, after test/controlplane/build.sh has built the control plane:
//
//	go test -v -count=1 ./test/e2ecp    # about 3 minutes; figures are the "FIGURE" lines
//
// The package holds only tests; this file exists to carry the documentation.
package e2ecp
