package proxier

import (
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// DefaultLiveness finds a vanished peer of an idle connection in 80 s:
// the first keep-alive probe after 30 s idle, then one every 10 s, and
// the connection ends after 5 unanswered. The user timeout is the same
// 80 s, so the kernel (which then ends a probed connection by time rather
// than by count) agrees, and data or a probe unacknowledged for 80 s ends
// a busy connection too (instead of ~15 minutes of retransmissions).
var DefaultLiveness = relay.Liveness{
	KeepAliveIdle:     30 * time.Second,
	KeepAliveInterval: 10 * time.Second,
	KeepAliveCount:    5,
	UserTimeout:       80 * time.Second,
}

// DefaultTCPWriteTimeout is how long a proxied direction may be unable to
// write a byte (the peer reads nothing) before both peers are reset;
// nginx's proxy_send_timeout is the same 60 s.
const DefaultTCPWriteTimeout = 60 * time.Second
