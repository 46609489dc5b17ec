// Package harness is where the repository's test tooling lives, so that the
// end-to-end suites (test/e2e, test/e2ecp), the benchmark tool (test/bench)
// and the commands under test/tools build on one implementation instead of
// each carrying its own.
//
// This package runs the binary under test and ties the parts to a network
// namespace: the module's commands built once per test binary (Binary, Main);
// kube-userspace-proxy started with the suites' common flags inside a
// namespace, waited for until /healthz is 200, and read back through its
// metrics, log and rules (Proxy); TCP and UDP probes that start in a
// namespace, from a chosen source address, and poll until a change shows
// (Client); backends served from inside a namespace (ServeBackend); threads
// that outlive the processes they fork, for processes started with Pdeathsig
// (PinThread, Launcher).
//
// Its sub-packages own the rest: netns, the namespace labs and the standard
// one-node cluster topology; backend, the self-naming backend servers, the
// client side of their protocol, and the benchmarks' servers.
//
// It only ever opens sockets on loopback or inside namespaces a test created,
// and everything it starts is stopped in t.Cleanup, failed test or not.
package harness
