package proxier

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// inflightPort is a UDP service port on loopback whose reply loop the test
// drives itself (Serve is not running), so that what the loop does when
// its deadline passes can be placed exactly: it cannot be timed from
// outside.
type inflightPort struct {
	lb     *loadbalancer.LoadBalancer
	name   loadbalancer.ServicePortName
	sock   *udpProxySocket
	client *net.UDPConn
}

func newInflightPort(t *testing.T, idle time.Duration, backends ...netip.AddrPort) *inflightPort {
	t.Helper()
	return newInflightPortWith(t, &socketConfig{
		dialTimeouts: defaultDialTimeouts, udpIdleTimeout: idle, metrics: NewMetrics(),
		udpMaxSessionsPerPort: 16, udpBudget: newUDPBudget(16),
	}, backends...)
}

// newInflightPortWith is newInflightPort with cfg, which several ports may
// share (as a proxier's sockets share its budget and metrics).
func newInflightPortWith(t *testing.T, cfg *socketConfig, backends ...netip.AddrPort) *inflightPort {
	t.Helper()
	ip := &inflightPort{
		lb:   loadbalancer.New(clock.RealClock{}, loadbalancer.Limits{}),
		name: loadbalancer.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "dns"}, Port: "p", Protocol: v1.ProtocolUDP},
	}
	sp := ip.lb.ServicePort(ip.name)
	ip.setEndpoints(backends...)
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if ip.sock, err = newUDPProxySocket(ip.name, conn, sp, nil, cfg); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { ip.sock.Close() })
	if ip.client, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ip.client.Close() })
	return ip
}

func (ip *inflightPort) setEndpoints(backends ...netip.AddrPort) {
	var eps []loadbalancer.Endpoint
	for _, b := range backends {
		eps = append(eps, loadbalancer.Endpoint{Addr: b, Ready: true, Serving: true})
	}
	ip.lb.SetEndpoints(ip.name, eps)
}

// send is the client's datagram as Serve would hand it on.
func (ip *inflightPort) send(payload string) {
	ip.sock.forward(ip.client.LocalAddr().(*net.UDPAddr).AddrPort(), []byte(payload), nil)
}

// session is the client's session (nil when closed).
func (ip *inflightPort) session() *udpSession {
	ip.sock.mu.Lock()
	defer ip.sock.mu.Unlock()
	return ip.sock.sessions.get(ip.client.LocalAddr().(*net.UDPAddr).AddrPort())
}

// waitReplyQueued waits until the backend's reply sits on the session's
// socket, unread.
func (ip *inflightPort) waitReplyQueued(t *testing.T, sess *udpSession) {
	t.Helper()
	ip.sock.mu.Lock()
	fd := sess.fd
	ip.sock.mu.Unlock()
	if fd < 0 {
		t.Fatal("the session was closed with its reply on the way")
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 3000); n != 1 || err != nil {
		t.Fatalf("the backend's reply did not arrive within 3 s (poll: %d, %v)", n, err)
	}
}

// relay is one turn of the reply loop woken by ready sockets.
func (ip *inflightPort) relay() {
	ip.sock.relayReady(ip.sock.poller.ready())
}

// reply is what the client receives within d ("" if nothing).
func (ip *inflightPort) reply(d time.Duration) string {
	_ = ip.client.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64)
	n, err := ip.client.Read(buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// A reply that reached the proxy before the session's idle timeout is
// relayed even when the reply loop only wakes after the timeout (a loaded
// node): the passed deadline no longer hides the ready socket. Before, the
// session was closed as idle with the reply unread, and the query was lost
// although its backend had answered in time.
func TestUDPReplyQueuedAtDeadlineIsRelayed(t *testing.T) {
	a := startUDPEcho(t, "127.0.0.1:0", "a:")
	const idle = 20 * time.Millisecond
	ip := newInflightPort(t, idle, a.LocalAddr().(*net.UDPAddr).AddrPort())
	ip.send("q")
	sess := ip.session()
	if sess == nil {
		t.Fatal("no session after the first datagram")
	}
	ip.waitReplyQueued(t, sess)
	time.Sleep(2 * idle) // the loop is late: the session's deadline has passed
	ip.sock.deadlinePassed()
	if got := ip.reply(time.Second); got != "a:q" {
		t.Fatalf("client got %q, want the reply a:q that arrived before the deadline", got)
	}
	// With its reply relayed the session is fresh, and idles out later.
	if ip.session() == nil {
		t.Fatal("the session was closed although its reply just passed")
	}
	time.Sleep(2 * idle)
	ip.sock.deadlinePassed()
	if ip.session() != nil {
		t.Fatal("an idle session with nothing queued outlived its timeout")
	}
}

// A datagram forwarded just before its endpoint is removed gets its reply
// (the backend process lives on), and the client's next datagram goes to a
// current endpoint. Before, the reply loop's endpoint sweep closed the
// session at once and the answer was dropped.
func TestUDPReplyFromRemovedEndpointInFlight(t *testing.T) {
	a := startUDPEcho(t, "127.0.0.1:0", "a:")
	b := startUDPEcho(t, "127.0.0.2:0", "b:")
	aAddr, bAddr := a.LocalAddr().(*net.UDPAddr).AddrPort(), b.LocalAddr().(*net.UDPAddr).AddrPort()
	const idle = 200 * time.Millisecond
	ip := newInflightPort(t, idle, aAddr)

	ip.send("q1")
	sess := ip.session()
	if sess == nil {
		t.Fatal("no session after the first datagram")
	}
	ip.setEndpoints(bAddr) // a leaves while its answer is on the way
	ip.sock.expireIdle()   // the loop's deadline passes before the answer is read
	ip.waitReplyQueued(t, sess)
	ip.relay()
	if got := ip.reply(time.Second); got != "a:q1" {
		t.Fatalf("client got %q, want a's answer a:q1 to the datagram sent before a was removed", got)
	}

	ip.send("q2")
	ip.relayWhenQueued(t)
	if got := ip.reply(time.Second); got != "b:q2" {
		t.Fatalf("the next datagram was answered by %q, want b:q2 (re-balanced off the removed endpoint)", got)
	}
}

// A removed endpoint's replies do not keep its session alive: it idles out
// from the client's last datagram, so a backend that keeps sending cannot
// hold a client on an endpoint that left the Service.
func TestUDPRemovedEndpointRepliesDoNotExtendSession(t *testing.T) {
	a := startUDPEcho(t, "127.0.0.1:0", "a:")
	const idle = 100 * time.Millisecond
	ip := newInflightPort(t, idle, a.LocalAddr().(*net.UDPAddr).AddrPort())
	ip.send("q")
	sess := ip.session()
	ip.setEndpoints()
	ip.sock.expireIdle()
	ip.waitReplyQueued(t, sess)
	ip.sock.mu.Lock()
	before := sess.lastActive
	ip.sock.mu.Unlock()
	ip.relay()
	if got := ip.reply(time.Second); got != "a:q" {
		t.Fatalf("client got %q, want a:q", got)
	}
	ip.sock.mu.Lock()
	after := sess.lastActive
	ip.sock.mu.Unlock()
	if after != before {
		t.Fatal("a reply from a removed endpoint refreshed its session")
	}
	time.Sleep(idle + idle/2)
	ip.sock.expireIdle()
	if ip.session() != nil {
		t.Fatal("the removed endpoint's session outlived its idle timeout")
	}
}

// relayWhenQueued relays the client's session's reply once it is queued.
func (ip *inflightPort) relayWhenQueued(t *testing.T) {
	t.Helper()
	sess := ip.session()
	if sess == nil {
		t.Fatal("no session")
	}
	ip.waitReplyQueued(t, sess)
	ip.relay()
}

// A service socket epoll refuses at first (here: already in the set, as
// ENOSPC or ENOMEM would refuse it) joins the poller on a later try and
// relays; before, Serve gave up and the port dropped every datagram.
func TestUDPServiceSocketJoinsPollerOnRetry(t *testing.T) {
	echo := startUDPEcho(t, "127.0.0.1:0", "")
	ip := newInflightPort(t, time.Minute, echo.LocalAddr().(*net.UDPAddr).AddrPort())
	raw, err := ip.sock.conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	_ = raw.Control(func(f uintptr) { fd = int(f) })
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(ip.sock.poller.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		t.Fatal(err)
	}
	go ip.sock.Serve()
	time.Sleep(100 * time.Millisecond) // Serve's first tries meet EEXIST
	if err := unix.EpollCtl(ip.sock.poller.epfd, unix.EPOLL_CTL_DEL, fd, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ip.client.WriteToUDPAddrPort([]byte("x"), ip.sock.conn.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
		t.Fatal(err)
	}
	_ = ip.client.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 8)
	if n, _, err := ip.client.ReadFromUDPAddrPort(buf); err != nil || string(buf[:n]) != "x" {
		t.Fatalf("reply %q, %v; want the echo", buf[:n], err)
	}
}
