// Package demo is the `kube-userspace-proxy demo` subcommand's body:
// Services explained without a cluster or root. It starts three loopback
// backends that answer with their names, writes example manifests for the
// real proxier (run in-process by the command, with --iptables=false),
// draws the path of one request through it with the run's addresses,
// replays session-affinity experiments once measured on a real cluster
// (kube-proxy in iptables mode) against the proxy sockets and prints what
// the cluster did next to what this proxy did. A fault section follows: the plain Service
// measured before, during and after a latency and a reset_peer toxic
// declared in its kube-userspace-proxy/faults annotation. With serve it then
// keeps the example up. RunNetNS (demo --netns, root) does the same through
// real iptables portals: the proxy as a process in a throw-away node
// namespace, the clients in another, then the rules and the conntrack
// entries; the namespaces go at the end.
//
// It owns the backends it runs (test/harness/backend servers in Demo mode:
// HTTP/1.1 and a UDP echo, both naming the backend),
// the manifest files, the client probes, the experiments and the tables. It does not own the proxier or how it is
// wired: the command hands that in as a Starter, and the demo looks at the
// proxier only through its debugging view (DebugServices, ProxyPort), as a
// user would through /debug/services.
package demo
