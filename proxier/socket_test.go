package proxier

import (
	"net"
	"os"
	"syscall"
	"testing"
)

// With --bind-address 0.0.0.0 an IPv4 service port listens on IPv4 only;
// gaining an IPv6 address reopens it dual-stack.
func TestProxySocketFamilyFollowsServiceIPs(t *testing.T) {
	p := newTestProxier(t, Options{BindAddress: mustAddr("0.0.0.0")})
	svc := makeService("web")
	p.OnServiceAdd(svc)
	p.Sync()
	listenIP := func() net.IP {
		ap := p.active[p.lbName("default/web:p")]
		return ap.socket.(*tcpProxySocket).addr.IP
	}
	if ip := listenIP(); ip.To4() == nil {
		t.Fatalf("IPv4-only service listens on %v, want 0.0.0.0", ip)
	}
	dual := makeService("web")
	dual.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
	p.OnServiceUpdate(svc, dual)
	p.Sync()
	if ip := listenIP(); ip.To4() != nil {
		t.Fatalf("dual-stack service listens on %v, want ::", ip)
	}
}

// Errors of one client and shortages are not logged as failures of the
// service port; anything else is.
func TestTemporaryAcceptErrors(t *testing.T) {
	wrap := func(e syscall.Errno) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", e)}
	}
	for _, tc := range []struct {
		err       error
		temporary bool
	}{
		{wrap(syscall.EMFILE), true},
		{wrap(syscall.ENOBUFS), true},
		{wrap(syscall.ECONNABORTED), true},
		{wrap(syscall.ENETUNREACH), true},
		{wrap(syscall.EHOSTDOWN), true},
		{syscall.EPROTO, true},
		{wrap(syscall.EBADF), false},
		{wrap(syscall.EINVAL), false},
	} {
		if got := isTemporaryAcceptError(tc.err); got != tc.temporary {
			t.Errorf("isTemporaryAcceptError(%v) = %v, want %v", tc.err, got, tc.temporary)
		}
	}
}
