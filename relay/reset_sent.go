package relay

import (
	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// sentAll tells whether the socket fd has sent all it holds (nothing is
// queued unsent, and the peer acknowledged most of what is in flight), so
// a reset now (SO_LINGER 0) drops nothing of it; or whether the peer
// reset or hung up, which ends a wait too. If not, the kernel is now set
// to wake the socket's waiters (an EPOLLOUT edge, which both data paths
// wait on) once it has: with TCP_NOTSENT_LOWAT 1 a socket is writable
// only with nothing unsent, and a poll that finds it not writable asks
// the kernel to signal writability (SOCK_NOSPACE), which a peer's ACK
// then raises. Only for a socket about to be reset: the low-water mark
// would stall writes otherwise, and it is never set on a socket to which
// a FIN of ours went (writable for good then: no edge would come).
func sentAll(fd int) bool {
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, 1)
	revents, err := rawio.PollOut(fd)
	return err != nil || revents != 0
}
