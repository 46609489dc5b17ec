package healthcheck

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/httpserver"
)

// loopback is where the tests' servers listen.
var loopback = []ListenAddr{{"tcp", "127.0.0.1"}}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestServiceHealthServer(t *testing.T) {
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	local := map[types.NamespacedName]int{web: 2}
	var proxyHealthy atomic.Bool
	proxyHealthy.Store(true)
	s := newServiceHealthServer(loopback, net.Listen, httpserver.DefaultLimits, func(nn types.NamespacedName, _ netip.Addr) int { return local[nn] }, proxyHealthy.Load)
	t.Cleanup(s.Close)
	port := freePort(t)
	if err := s.SyncServices(map[types.NamespacedName]int{web: port}); err != nil {
		t.Fatal(err)
	}
	get := func() (int, serviceHealthBody) {
		t.Helper()
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if w, want := resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), strconv.Itoa(local[web]); w != want {
			t.Errorf("X-Load-Balancing-Endpoint-Weight %q, want %q (the local endpoint count, as kube-proxy)", w, want)
		}
		var b serviceHealthBody
		if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	if code, b := get(); code != 200 || b.LocalEndpoints != 2 || b.Service.Name != "web" {
		t.Fatalf("with local endpoints: %d %+v", code, b)
	}
	// Syncs that lag fail the node for every Service, as kube-proxy's.
	proxyHealthy.Store(false)
	if code, b := get(); code != 503 || b.LocalEndpoints != 2 || b.ServiceProxyHealthy {
		t.Fatalf("proxy unhealthy: %d %+v, want 503 with serviceProxyHealthy false", code, b)
	}
	proxyHealthy.Store(true)
	local[web] = 0
	if code, b := get(); code != 503 || b.LocalEndpoints != 0 || !b.ServiceProxyHealthy {
		t.Fatalf("without local endpoints: %d %+v", code, b)
	}
	if err := s.SyncServices(nil); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
		c.Close()
		t.Fatal("health port still open after its Service went away")
	}
}

// TestServiceHealthServerClosesIdleConnections: healthCheckNodePort
// servers are built with the shared limits, so a load balancer's kept-alive
// probe connection is closed at the idle timeout.
func TestServiceHealthServerClosesIdleConnections(t *testing.T) {
	limits := httpserver.DefaultLimits
	limits.IdleTimeout = 300 * time.Millisecond
	nn := types.NamespacedName{Namespace: "default", Name: "web"}
	s := newServiceHealthServer(loopback, net.Listen, limits, func(types.NamespacedName, netip.Addr) int { return 1 }, nil)
	t.Cleanup(s.Close)
	port := freePort(t)
	if err := s.SyncServices(map[types.NamespacedName]int{nn: port}); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: node\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle probe connection not closed by the server: %v", err)
	}
}

// ipNets is a fake net.InterfaceAddrs: the node's addresses as interface
// prefixes.
func ipNets(cidrs ...string) func() ([]net.Addr, error) {
	return func() ([]net.Addr, error) {
		var out []net.Addr
		for _, c := range cidrs {
			ip, n, err := net.ParseCIDR(c)
			if err != nil {
				return nil, err
			}
			n.IP = ip
			out = append(out, n)
		}
		return out, nil
	}
}

// TestListenAddrs: healthCheckNodePorts listen where NodePorts answer, as
// kube-proxy's: every address without --nodeport-addresses, else each node
// address inside the CIDRs (a family without a CIDR, or with a /0, is not
// restricted, as in the NodePort rules); every address when the node's
// addresses cannot be listed.
func TestListenAddrs(t *testing.T) {
	node := ipNets("127.0.0.1/8", "10.0.0.5/24", "192.168.1.7/24", "192.168.1.8/24", "::1/128", "fd00::5/64", "fe80::1/64")
	noIPv6 := ipNets("127.0.0.1/8", "10.0.0.5/24")
	broken := func() ([]net.Addr, error) { return nil, errors.New("netlink: operation not permitted") }
	all := []ListenAddr{{"tcp", ""}}
	for _, tt := range []struct {
		name  string
		cidrs []string
		addrs func() ([]net.Addr, error)
		want  []ListenAddr
	}{
		{"no flag: every address", nil, node, all},
		{"one IPv4 CIDR: its addresses, IPv6 unrestricted", []string{"192.168.1.0/24"}, node,
			[]ListenAddr{{"tcp", "192.168.1.7"}, {"tcp", "192.168.1.8"}, {"tcp6", "::"}}},
		{"one IPv4 CIDR on a node without IPv6", []string{"10.0.0.0/8"}, noIPv6, []ListenAddr{{"tcp", "10.0.0.5"}}},
		{"both families", []string{"10.0.0.0/8", "fd00::/8", "fe80::/10"}, node, []ListenAddr{{"tcp", "10.0.0.5"}, {"tcp", "fd00::5"}}},
		{"IPv6 CIDR only", []string{"fd00::/64"}, node, []ListenAddr{{"tcp4", "0.0.0.0"}, {"tcp", "fd00::5"}}},
		{"an IPv4-mapped CIDR is its IPv4 prefix", []string{"::ffff:10.0.0.0/104"}, node, []ListenAddr{{"tcp", "10.0.0.5"}, {"tcp6", "::"}}},
		{"/0 of each family: every address", []string{"0.0.0.0/0", "::/0"}, node, all},
		{"no address inside: nowhere", []string{"172.16.0.0/12"}, noIPv6, nil},
		{"addresses not listed: every address", []string{"10.0.0.0/8"}, broken, all},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var cidrs []netip.Prefix
			for _, c := range tt.cidrs {
				cidrs = append(cidrs, netip.MustParsePrefix(c))
			}
			if got := ListenAddrs(cidrs, tt.addrs); !slices.Equal(got, tt.want) {
				t.Errorf("ListenAddrs(%v) = %v, want %v", tt.cidrs, got, tt.want)
			}
		})
	}
}

// TestServiceHealthListensOnEachAddress: a Service's healthCheckNodePort
// listens on each address; one that fails closes the others (the port is
// retried whole next sync, as kube-proxy's), and a Service that goes
// closes all of its listeners.
func TestServiceHealthListensOnEachAddress(t *testing.T) {
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	addrs := []ListenAddr{{"tcp", "127.0.0.1"}, {"tcp", "127.0.0.2"}, {"tcp6", "::"}}
	var listened []string
	open := map[string]net.Listener{}
	failOn := "[::]:30200"
	listen := func(network, address string) (net.Listener, error) {
		listened = append(listened, network+" "+address)
		if address == failOn {
			return nil, errors.New("bind: address already in use")
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0") // a stand-in for address
		if err == nil {
			open[address] = ln
		}
		return ln, err
	}
	closed := func(address string) bool {
		c, err := net.Dial("tcp", open[address].Addr().String())
		if err == nil {
			c.Close()
		}
		return err != nil
	}
	s := newServiceHealthServer(addrs, listen, httpserver.DefaultLimits, func(types.NamespacedName, netip.Addr) int { return 1 }, nil)
	t.Cleanup(s.Close)

	if err := s.SyncServices(map[types.NamespacedName]int{web: 30200}); err == nil || !strings.Contains(err.Error(), "healthCheckNodePort 30200 of default/web") {
		t.Fatalf("a listen failed: SyncServices = %v, want the port's error", err)
	}
	if want := []string{"tcp 127.0.0.1:30200", "tcp 127.0.0.2:30200", "tcp6 [::]:30200"}; !slices.Equal(listened, want) {
		t.Fatalf("listened on %q, want %q", listened, want)
	}
	if !closed("127.0.0.1:30200") || !closed("127.0.0.2:30200") {
		t.Fatal("the addresses that opened stayed open after another failed")
	}

	failOn, listened = "", nil
	if err := s.SyncServices(map[types.NamespacedName]int{web: 30200}); err != nil {
		t.Fatal(err)
	}
	if len(listened) != 3 {
		t.Fatalf("retry listened on %q, want all three addresses", listened)
	}
	for _, a := range []string{"127.0.0.1:30200", "127.0.0.2:30200", "[::]:30200"} {
		resp, err := http.Get("http://" + open[a].Addr().String() + "/")
		if err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s answered %d, want 200", a, resp.StatusCode)
		}
	}
	listened = nil
	if err := s.SyncServices(map[types.NamespacedName]int{web: 30200}); err != nil || listened != nil {
		t.Fatalf("an unchanged sync listened on %q (%v)", listened, err)
	}
	if err := s.SyncServices(nil); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"127.0.0.1:30200", "127.0.0.2:30200", "[::]:30200"} {
		if !closed(a) {
			t.Errorf("%s still open after its Service went away", a)
		}
	}
}

// A healthCheckNodePort that cannot be listened on is told to ListenFailed
// (the proxy's FailedToStartServiceHealthcheck event) once, not on every
// sync that retries it; again after it opened and failed anew, or for a
// new port.
func TestServiceHealthListenFailedToldOnce(t *testing.T) {
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	fail := true
	listen := func(network, address string) (net.Listener, error) {
		if fail {
			return nil, errors.New("bind: address already in use")
		}
		return net.Listen("tcp", "127.0.0.1:0")
	}
	s := newServiceHealthServer([]ListenAddr{{"tcp", "127.0.0.1"}}, listen, httpserver.DefaultLimits, func(types.NamespacedName, netip.Addr) int { return 1 }, nil)
	t.Cleanup(s.Close)
	var told []string
	s.ListenFailed = func(nn types.NamespacedName, port int, err error) {
		told = append(told, fmt.Sprintf("%s %d %v", nn, port, err))
	}
	sync := func(port int) {
		_ = s.SyncServices(map[types.NamespacedName]int{web: port})
	}
	sync(30200)
	sync(30200)
	sync(30200)
	sync(30201) // a new port
	fail = false
	sync(30201)
	_ = s.SyncServices(nil) // gone: closes it
	fail = true
	sync(30201) // fails anew
	want := []string{
		"default/web 30200 bind: address already in use",
		"default/web 30201 bind: address already in use",
		"default/web 30201 bind: address already in use",
	}
	if !slices.Equal(told, want) {
		t.Errorf("told %q, want %q", told, want)
	}
}
