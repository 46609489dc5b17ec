package proxier

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// listenProtocol is the kernel's protocol of a listening socket:
// IPPROTO_TCP or IPPROTO_MPTCP.
func listenProtocol(t *testing.T, lc net.ListenConfig) int {
	t.Helper()
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var proto int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		proto, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return proto
}

// Go's default listener is MPTCP since 1.24; the proxy sockets are plain
// TCP unless asked, and claims always are.
func TestProxySocketsListenWithPlainTCPUnlessAsked(t *testing.T) {
	if p := listenProtocol(t, New(Options{}).sockCfg.listen); p != unix.IPPROTO_TCP {
		t.Errorf("default proxy socket protocol %d, want IPPROTO_TCP (%d)", p, unix.IPPROTO_TCP)
	}
	if p := listenProtocol(t, listenConfig); p != unix.IPPROTO_TCP {
		t.Errorf("claim socket protocol %d, want IPPROTO_TCP (%d)", p, unix.IPPROTO_TCP)
	}
	var probe net.ListenConfig
	if listenProtocol(t, probe) != unix.IPPROTO_MPTCP {
		t.Skip("this kernel gives Go no MPTCP listener (net.mptcp.enabled=0?)")
	}
	if p := listenProtocol(t, New(Options{MultipathTCP: true}).sockCfg.listen); p != unix.IPPROTO_MPTCP {
		t.Errorf("MultipathTCP proxy socket protocol %d, want IPPROTO_MPTCP (%d)", p, unix.IPPROTO_MPTCP)
	}
}

// --mptcp with the default liveness options (TCP_USER_TIMEOUT among them,
// which an MPTCP socket refuses with ENOPROTOOPT) still listens with MPTCP:
// the refusal made Go's MPTCP listener fall back to plain TCP in silence.
func TestMultipathTCPWithLiveness(t *testing.T) {
	var probe net.ListenConfig
	if listenProtocol(t, probe) != unix.IPPROTO_MPTCP {
		t.Skip("this kernel gives Go no MPTCP listener (net.mptcp.enabled=0?)")
	}
	l := relay.Liveness{KeepAliveIdle: 30 * time.Second, KeepAliveInterval: 10 * time.Second, KeepAliveCount: 5, UserTimeout: 80 * time.Second}
	if p := listenProtocol(t, New(Options{MultipathTCP: true, Liveness: l}).sockCfg.listen); p != unix.IPPROTO_MPTCP {
		t.Errorf("MultipathTCP proxy socket with liveness options: protocol %d, want IPPROTO_MPTCP (%d)", p, unix.IPPROTO_MPTCP)
	}
}
