// Package controlplane runs a real etcd and kube-apiserver on loopback for tests: random
// free ports, a temporary data and certificate directory, token authentication with an
// admin token (system:masters) and a proxy token (the kube-system/kube-userspace-proxy
// service account, which has no rights until a test applies examples/deploy's RBAC), RBAC
// authorization and a generated service-account key.
//
// The binaries come from the wrapper modules next to this file, built by build.sh into a
// cache directory outside the repository. Start skips the test when they are not built,
// unless KUP_BUILD_CONTROLPLANE is set, in which case it builds them first.
//
// Every process is started by this package, stopped by PID and every directory removed
// when the test ends, even when it fails.
//
// Typical use:
//
//	cp := controlplane.Start(t, controlplane.Options{})   // or Options{NetNS: "node"}
//	admin := cp.AdminClient(t)
//	ns := cp.Namespace(t)
//	// run the proxy with --kubeconfig=cp.ProxyKubeconfig (after applying the RBAC)
//	cp.StopAPIServer()  // an outage: etcd keeps running
//	err := cp.StartAPIServer()
//	cp.StopEtcd()       // a storage outage: kube-apiserver keeps running
//	err = cp.StartEtcd()
package controlplane
