package proxier

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

type svcOpt func(*v1.Service)

func makeService(name string, opts ...svcOpt) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withProtocol(p v1.Protocol) svcOpt {
	return func(s *v1.Service) { s.Spec.Ports[0].Protocol = p }
}

func withClientIPAffinity(seconds int32) svcOpt {
	return func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(seconds)}}
	}
}

func withNodePort(port int32) svcOpt {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = port
	}
}

func withClusterIP(ip string) svcOpt {
	return func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip} }
}

func makeSlice(svc string, proto v1.Protocol, addrs ...string) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: svc + "-abc",
			Labels: map[string]string{discovery.LabelServiceName: svc},
		},
		AddressType: discovery.AddressTypeIPv4,
	}
	// addrs are "ip:port"; all share the port of the first (slices have one port list).
	for _, a := range addrs {
		host, port, _ := net.SplitHostPort(a)
		if len(es.Ports) == 0 {
			p, _ := strconv.Atoi(port)
			es.Ports = []discovery.EndpointPort{{Name: ptr.To("p"), Port: ptr.To(int32(p)), Protocol: ptr.To(proto)}}
		}
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{host}, Conditions: discovery.EndpointConditions{Ready: ptr.To(true)}})
	}
	return es
}

// namedBackend is a TCP server on loopback that answers every connection
// with its name and closes. All backends of a test share one port number
// by listening on different loopback addresses, as endpoints of one
// EndpointSlice port do.
type namedBackend struct {
	name string
	ln   net.Listener
	wg   sync.WaitGroup
}

func startBackends(t *testing.T, ips ...string) []*namedBackend {
	t.Helper()
	var out []*namedBackend
	port := "0"
	for i, ip := range ips {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, port))
		if err != nil {
			t.Fatalf("backend listen: %v", err)
		}
		port = portOf(ln.Addr())
		b := &namedBackend{name: "backend-" + string(rune('a'+i)), ln: ln}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				io.WriteString(c, b.name+"\n")
				c.Close()
			}
		}()
		t.Cleanup(func() { ln.Close(); b.wg.Wait() })
		out = append(out, b)
	}
	return out
}

func portOf(a net.Addr) string {
	_, p, _ := net.SplitHostPort(a.String())
	return p
}

// askName connects from srcIP to addr and returns the first line read.
func askName(t *testing.T, srcIP, addr string) (string, error) {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(srcIP)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(line), nil
}

// askUDP sends q in one datagram to addr from a socket of its own and
// returns the answer, or the read's error (a refusal, or none in wait).
func askUDP(t *testing.T, addr, q string, wait time.Duration) (string, error) {
	t.Helper()
	c, err := net.Dial("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(q)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// stopNow runs p with a context already cancelled: the proxy's stop, as
// at SIGTERM, with nothing served in between. It closes every socket.
func stopNow(p *Proxier) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.Run(ctx)
}

func newTestProxier(t *testing.T, opts Options) *Proxier {
	t.Helper()
	if !opts.BindAddress.IsValid() {
		opts.BindAddress = mustAddr("127.0.0.1")
	}
	if opts.DataPath == "" && opts.Dialer == nil {
		// make test runs the suite once per data path.
		opts.DataPath = os.Getenv("KUP_TEST_DATA_PATH")
	}
	p := New(opts)
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	t.Cleanup(func() { stopNow(p) })
	return p
}

func proxyAddr(t *testing.T, p *Proxier, servicePort string) string {
	t.Helper()
	port, ok := p.ProxyPort(servicePort)
	if !ok {
		t.Fatalf("no proxy socket for %s; table: %+v", servicePort, p.DebugServices())
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// wantRefused fails unless a connect to addr is refused (ECONNREFUSED:
// nothing listens there).
func wantRefused(t *testing.T, addr, what string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("connect to %s (%s) completed a handshake; want it refused", addr, what)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connect to %s (%s): %v, want ECONNREFUSED", addr, what, err)
	}
}

// faultedWeb is a proxier whose fault table tracks live connections (as
// with the fault API on), serving Service web on an echo backend.
func faultedWeb(t *testing.T, path string) (*Proxier, *faults.Table, string) {
	t.Helper()
	backend := echoBackends(t, "127.0.0.2")[0]
	table := faults.NewTable(0, 0, nil)
	table.TrackLive = true
	p := newTestProxier(t, Options{DataPath: path, Faults: table})
	p.OnServiceAdd(makeService("web"))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, backend))
	p.Sync()
	return p, table, proxyAddr(t, p, "default/web:p")
}

func isConnReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

// serveTCP runs handle for every connection accepted on ip (random port)
// until the test ends.
func serveTCP(t *testing.T, ip string, handle func(c net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln
}

// lbName finds the ServicePortName for its string form.
func (p *Proxier) lbName(servicePort string) loadbalancer.ServicePortName {
	p.debugMu.RLock()
	defer p.debugMu.RUnlock()
	for _, r := range p.debug {
		if r.key == servicePort {
			return r.name
		}
	}
	return loadbalancer.ServicePortName{}
}
