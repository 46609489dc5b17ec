// Package relay owns moving bytes between a client and its backend, on
// either of the proxy's two TCP data paths.
//
// The goroutine relay (Conn, TCP) takes two connected sockets, the client
// connection a proxy socket accepted and the backend connection the caller
// dialled, and owns their copy loops: splice through pooled pipes, a
// buffered copy, and whatever Copier a caller plugs in per direction, such
// as a fault pipeline.
//
// The event-loop data path (Group, Loop, LoopConn) owns a connection from
// its accept on: the listening sockets it serves (ListenTCP, Group.Listen,
// Acceptor, the kernel's accept order where the caller needs it), the
// non-blocking dial of the backend with its per-attempt timeouts, moving on
// to the next endpoint the Handler names when one fails, and the bytes
// moved on readiness by loops of one goroutine each.
//
// On both, a client that resets while its backend is dialled ends the
// dial (ErrClientGone; the goroutine relay's NewClientAttempt): nobody is
// left to relay for, and no endpoint is at fault. Its FIN alone does not.
//
// Both own half-close propagation with its inactivity bound, the write
// bound, closing at a quiet moment (CloseWhenQuiet: max connection age,
// drain), the keep-alive and TCP_USER_TIMEOUT options of both sockets
// (Liveness), the handshake's held ACK, how an end is passed on (a FIN for
// a clean end, a reset for an abnormal one), and the descriptor reserve
// that refuses a client rather than spend the descriptors kept back for the
// proxy's own servers (SetDescriptorCeiling).
//
// It never touches the service table, the load balancer, iptables or a
// metrics registry: the caller decides which backend (Handler.Backend) and
// which faults, and hands in counters. TCP takes ownership of both
// connections and has closed both when it returns.
package relay
