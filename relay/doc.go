// Package relay owns moving bytes between two connected sockets: the client
// connection a proxy socket accepted and the backend connection it dialled.
//
// It owns the copy loops (splice through pooled pipes, a buffered copy, and
// whatever Copier a caller plugs in per direction, such as a fault
// pipeline), half-close propagation with its inactivity bound, the write
// bound, closing at a quiet moment (CloseWhenQuiet: max connection age,
// drain), the keep-alive and TCP_USER_TIMEOUT options of both sockets
// (Liveness), and how an end is passed on (a FIN for a clean end, a reset
// for an abnormal one).
//
// It never touches the service table, the load balancer, iptables or a
// metrics registry: the caller decides which backend and which faults, and
// hands in counters. TCP takes ownership of both connections and has closed
// both when it returns.
package relay
