package healthcheck

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/httpserver"
)

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
	s := NewServiceHealthServer("127.0.0.1", httpserver.DefaultLimits, func(nn types.NamespacedName) int { return local[nn] }, proxyHealthy.Load)
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
	s := NewServiceHealthServer("127.0.0.1", limits, func(types.NamespacedName) int { return 1 }, nil)
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
