package proxier

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// "No endpoint" is said at -v=0 once per period per service port; the
// rest are counted into the next line.
func TestNoBackendLogRateLimited(t *testing.T) {
	buf := captureKlog(t)

	var l noBackendLog
	client := netip.MustParseAddrPort("10.0.0.1:1234")
	for range 5 {
		l.report("default/web:http", client, errors.New("no endpoints"))
	}
	klog.Flush()
	if n := strings.Count(buf.String(), "No endpoint could be reached"); n != 1 {
		t.Fatalf("%d lines at -v=0 for 5 failures in a row, want 1:\n%s", n, buf.String())
	}
	if got := l.suppressed.Load(); got != 4 {
		t.Fatalf("%d suppressed, want 4", got)
	}
}

// A service port with no endpoint says where a newcomer's mistake usually
// is (an EndpointSlice not labelled for the Service, none ready) and which
// command names it; the line said only "No endpoint could be reached"
// with err="no endpoints available".
func TestNoBackendLogSaysWhyThereIsNoEndpoint(t *testing.T) {
	buf := captureKlog(t)

	var l noBackendLog
	l.report("default/app:http", netip.MustParseAddrPort("10.0.0.1:1234"), loadbalancer.ErrNoEndpoints)
	klog.Flush()
	for _, want := range []string{"kubernetes.io/service-name", "kube-userspace-proxy explain"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("line lacks %q:\n%s", want, buf.String())
		}
	}
}

// connect's EADDRNOTAVAIL is also a node without a usable source address
// of the endpoint's family (IPv6 disabled, an address still tentative):
// the line said only "out of descriptors or ports", and sent the operator
// after a leak that was not there.
func TestNoBackendLogNamesAMissingSourceAddress(t *testing.T) {
	buf := captureKlog(t)

	var l noBackendLog
	l.report("t/mis4:http", netip.MustParseAddrPort("10.61.1.2:42662"), &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", unix.EADDRNOTAVAIL)})
	klog.Flush()
	if want := "or no source address of the endpoint's IP family"; !strings.Contains(buf.String(), want) {
		t.Fatalf("line lacks %q:\n%s", want, buf.String())
	}
}

// A new UDP client whose datagram is dropped at the total session cap (no
// port has an idle session to close: here the only one holds a client
// datagram a fault delays) is said at -v=0, as a TCP client refused for
// want of descriptors is: it was counted in
// udp_session_limit_total{action="dropped"} and logged nowhere, at any
// verbosity, while the client (another Service's, kube-dns) waited out its
// timeouts.
func TestUDPSessionCapDropLogged(t *testing.T) {
	buf := captureKlog(t)
	sessionLimitDrops.last.Store(0) // another test's line must not hold this one back

	a := startUDPEcho(t, "127.0.0.2:0", "a:")
	p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, nil), UDPMaxSessions: 1, UDPIdleTimeout: time.Hour})
	// Service one's first datagram waits 5 s in a latency toxic: until it
	// is sent, its session is not one to give up.
	p.OnServiceAdd(makeService("one", withProtocol(v1.ProtocolUDP),
		withFaults(`[{"name":"lat","type":"latency","stream":"upstream","attributes":{"latency":5000}}]`)))
	p.OnServiceAdd(makeService("two", withProtocol(v1.ProtocolUDP)))
	for _, name := range []string{"one", "two"} {
		p.OnEndpointSliceAdd(makeSlice(name, v1.ProtocolUDP, a.LocalAddr().String()))
	}
	p.Sync()
	ask := func(svc string) error {
		c, err := net.Dial("udp", proxyAddr(t, p, "default/"+svc+":p"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, err = c.Read(make([]byte, 64))
		return err
	}
	one, err := net.Dial("udp", proxyAddr(t, p, "default/one:p"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close() })
	if _, err := one.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	oneSock := p.active[p.lbName("default/one:p")].socket.(*udpProxySocket)
	for deadline := time.Now().Add(20 * time.Second); ; {
		oneSock.mu.Lock()
		delayed := oneSock.sessions.oldest != nil && oneSock.sessions.oldest.upDeferredUntil > mono.Now()
		oneSock.mu.Unlock()
		if delayed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Service one's first datagram never held in its latency toxic")
		}
		time.Sleep(time.Millisecond)
	}
	if err := ask("two"); err == nil {
		t.Fatal("the second Service's client was answered past a total cap of 1")
	}
	// Counted after it is logged: once counted, the line is written.
	dropped := p.active[p.lbName("default/two:p")].socket.(*udpProxySocket).capDropped
	for deadline := time.Now().Add(20 * time.Second); dropped.value() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the second Service's datagram was never dropped at the cap")
		}
		time.Sleep(10 * time.Millisecond)
	}
	klog.Flush()
	if want := "UDP datagrams of new clients dropped"; !strings.Contains(buf.String(), want) {
		t.Fatalf("no line %q for the datagram dropped at the cap:\n%s", want, buf.String())
	}
}

// A datagram dropped at the port's own cap (--udp-max-sessions-per-port:
// every one of its oldest sessions holds a client datagram a fault still
// delays) is not blamed on the total cap: its line said "the proxy holds
// every UDP session it may (--udp-max-sessions ...)", which sends an
// operator to raise a cap that was nowhere near, while the port's own was
// the one reached.
func TestUDPPortCapDropNotBlamedOnTheTotalCap(t *testing.T) {
	s := &udpProxySocket{cfg: &socketConfig{udpMaxSessionsPerPort: 1, udpBudget: newUDPBudget(100)}, sessions: newUDPSessionTable()}
	now := mono.Now()
	s.sessions.add(&udpSession{client: netip.MustParseAddrPort("10.0.0.1:5353"), fd: -1, upDeferredUntil: now + int64(time.Hour)}, now)
	err := s.makeRoomLocked(now)
	if !errors.Is(err, errSessionLimit) {
		t.Fatalf("makeRoomLocked at the port's cap with its only session's datagram delayed: %v, want a session limit", err)
	}
	buf := captureKlog(t)
	sessionLimitDrops.last.Store(0)
	var l noBackendLog
	l.report("default/dns:p", netip.MustParseAddrPort("10.0.0.2:5353"), err)
	klog.Flush()
	line := buf.String()
	if !strings.Contains(line, "--udp-max-sessions-per-port") || strings.Contains(line, "holds every UDP session it may") {
		t.Fatalf("the line for a datagram dropped at the port's own cap does not name it (or blames the total cap):\n%s", line)
	}
}

// A datagram the relay loop read just before its port closed (a Service
// deleted, a socket reopened, the proxy stopping) is dropped quietly: it
// was counted in connections_failed_total and logged at -v=0 as a refused
// client ("No endpoint could be reached; the client was refused ... use of
// closed network connection"), though no client was refused and no
// endpoint failed.
func TestUDPDatagramAtCloseIsNoFailure(t *testing.T) {
	buf := captureKlog(t)
	a := startUDPEcho(t, "127.0.0.1:0", "a:")
	ip := newInflightPort(t, time.Minute, a.LocalAddr().(*net.UDPAddr).AddrPort())
	ip.sock.Close()
	ip.send("q")
	klog.Flush()
	if got := ip.sock.failed.value(); got != 0 || strings.Contains(buf.String(), "No endpoint could be reached") {
		t.Fatalf("a datagram forwarded as the port closed: connections_failed_total %v, log:\n%s", got, buf.String())
	}
}

// lockedBuffer is a klog output a test may read while the proxier's
// goroutines still write to it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A client refused because every endpoint refused its dial is logged with
// the endpoints dialled, on both data paths: a newcomer whose backends are
// not up yet must see which addresses the proxy went to. The event loop's
// line said only `err="connection refused"`, the goroutines' named the
// last endpoint only.
func TestNoBackendLogNamesTheEndpointsTried(t *testing.T) {
	for _, path := range []string{DataPathGoroutines, DataPathEventLoop} {
		t.Run(path, func(t *testing.T) {
			captureKlog(t)
			var logs lockedBuffer
			klog.SetOutput(&logs)
			// Two endpoints nothing listens on (a slice's endpoints share
			// its port): a port just released, on two loopback addresses.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := ln.Addr().(*net.TCPAddr).Port
			ln.Close()
			dead := []string{fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.2:%d", port)}
			p := newTestProxier(t, Options{DataPath: path})
			p.OnServiceAdd(makeService("web"))
			p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, dead...))
			p.Sync()
			// The reset may come before the client's connect returns.
			if c, err := net.Dial("tcp", proxyAddr(t, p, "default/web:p")); err == nil {
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
				if _, err := c.Read(make([]byte, 1)); err == nil {
					t.Fatal("a client of a Service whose endpoints all refuse was answered")
				}
			}
			var line string
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if line = logs.String(); strings.Contains(line, "No endpoint could be reached") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no line for the refused client:\n%s", line)
				}
			}
			for _, ep := range dead {
				if !strings.Contains(line, ep) {
					t.Errorf("the refused client's line does not name endpoint %s:\n%s", ep, line)
				}
			}
		})
	}
}
