// Package faults owns fault injection per service port: the toxics a
// Service declares in its kube-userspace-proxy/faults annotation or the
// fault API sets live, in Toxiproxy's vocabulary plus connect-time and UDP
// faults; the decision, once per connection at accept (or per datagram),
// of which toxics apply, drawn from a seeded pure function so a run can be
// repeated; and the chunk pipelines that apply them.
//
// The proxier calls one small surface: Port.Accept for a TCP connection
// (nil = no fault, the connection stays on the splice path) and
// Port.Datagrams for UDP. Bytes still move through package relay; this
// package only supplies relay.Copier functions for faulted directions. It
// never touches the service table, the balancer or iptables.
package faults
