package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The API client asks for what --kube-api-content-type (clientConnection.
// contentType) and clientConnection.acceptContentTypes say, as kube-proxy's
// createClient sets them: the Accept header was pinned to protobuf, so a
// content type of application/json changed only the bodies sent (events)
// and every list and watch still came back protobuf, and acceptContentTypes
// was ignored.
func TestAPIClientAcceptFollowsContentTypes(t *testing.T) {
	var mu sync.Mutex
	var accept string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		accept = r.Header.Get("Accept")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"ServiceList","apiVersion":"v1","metadata":{},"items":[]}`))
	}))
	defer api.Close()
	file := func(clientConnection string) string {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
			"clientConnection: "+clientConnection+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		name string
		args []string
		// want is the Accept header's first media type; protobuf whether
		// protobuf may be answered.
		want     string
		protobuf bool
	}{
		{"default", nil, "application/vnd.kubernetes.protobuf", true},
		{"flag json", []string{"--kube-api-content-type", "application/json"}, "application/json", false},
		{"file json", []string{"--config", file("{contentType: application/json}")}, "application/json", false},
		{"file accept json", []string{"--config", file("{acceptContentTypes: application/json}")}, "application/json", false},
		{"flag protobuf over file json", []string{"--config", file("{contentType: application/json}"),
			"--kube-api-content-type", "application/vnd.kubernetes.protobuf"}, "application/vnd.kubernetes.protobuf", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := parsedOptions(t, append([]string{"--master", api.URL}, tc.args...))
			client, err := apiClient(o)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := client.CoreV1().Services("").List(context.Background(), metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			got := accept
			mu.Unlock()
			first, _, _ := strings.Cut(got, ",")
			if first != tc.want || strings.Contains(got, "protobuf") != tc.protobuf {
				t.Errorf("Accept %q: want it to start with %s, protobuf accepted %v", got, tc.want, tc.protobuf)
			}
			// /configz shows what is asked for.
			if shown := o.effectiveConfig().ClientConnection.AcceptContentTypes; shown != got {
				t.Errorf("/configz acceptContentTypes %q, the client sends %q", shown, got)
			}
		})
	}
}

// The API client's HTTP/2 health check pings a silent connection after
// 5 s, not client-go's 30 s (see apiHealthCheck); a value the environment
// gives is kept.
func TestAPIClientShortensHTTP2HealthCheck(t *testing.T) {
	t.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "")
	t.Setenv("HTTP2_PING_TIMEOUT_SECONDS", "60")
	if _, err := apiClient(parsedOptions(t, []string{"--master", "https://127.0.0.1:1"})); err != nil {
		t.Fatal(err)
	}
	if got := os.Getenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS"); got != "5" {
		t.Errorf("HTTP2_READ_IDLE_TIMEOUT_SECONDS %q, want 5", got)
	}
	if got := os.Getenv("HTTP2_PING_TIMEOUT_SECONDS"); got != "60" {
		t.Errorf("HTTP2_PING_TIMEOUT_SECONDS %q, want the environment's 60", got)
	}
}

// --init-only builds the API client, as kube-proxy's does (newProxyServer
// calls createClient before --init-only returns): an init container whose
// client cannot be built (a kubeconfig without a usable context or server,
// the in-cluster token missing) exited 0, and the proxy then exited 1.
func TestInitOnlyBuildsTheAPIClient(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := func(name, currentContext string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("apiVersion: v1\nkind: Config\n"+
			"clusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n"+
			"users: [{name: u, user: {token: t}}]\n"+
			"contexts: [{name: x, context: {cluster: c, user: u}}]\n"+
			"current-context: "+currentContext+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		name string
		args []string
		env  bool // in a "pod": KUBERNETES_SERVICE_HOST/PORT set
		code int
		want string // in stderr
	}{
		{"usable kubeconfig", []string{"--kubeconfig", kubeconfig("good", "x")}, false, 0, ""},
		{"no such context", []string{"--kubeconfig", kubeconfig("bad", "missing")}, false, 1, `context was not found for specified context: missing`},
		{"master alone", []string{"--master", "https://127.0.0.1:1"}, false, 0, ""},
		{"in-cluster without a token", nil, true, 1, "serviceaccount/token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, port := "", ""
			if tc.env {
				if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
					t.Skip("running in a pod: its token is there")
				}
				host, port = "127.0.0.1", "6443"
			}
			t.Setenv("KUBERNETES_SERVICE_HOST", host)
			t.Setenv("KUBERNETES_SERVICE_PORT", port)
			var code int
			stderr := capture(t, &os.Stderr, func() {
				code = runMain(append([]string{"--iptables=false", "--init-only"}, tc.args...))
			})
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr, tc.code, tc.want)
			}
		})
	}
}

// KUBECONFIG is not read, as kube-proxy does not read it (--kubeconfig
// only): with it set and no flag, the no-source error says so, instead of
// leaving a kubectl user to wonder why the file was not taken.
func TestNoSourceNamesKUBECONFIG(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBECONFIG", "/etc/kubernetes/proxy.conf")
	var code int
	stderr := capture(t, &os.Stderr, func() { code = runMain([]string{"--iptables=false"}) })
	if code != exitUsage || !strings.Contains(stderr, "KUBECONFIG is not read") || !strings.Contains(stderr, "--kubeconfig /etc/kubernetes/proxy.conf") {
		t.Errorf("exit %d, stderr %q; want %d and KUBECONFIG named", code, stderr, exitUsage)
	}
}

// --kube-api-burst 0 beside a positive QPS cannot make a client (client-go:
// "burst is required to be greater than 0 when RateLimiter is not set and
// QPS is set to greater than 0"): a flag error (exit 2), not the exit 1 at
// the client's start it was, after validation passed. A QPS of 0 (client-
// go's defaults for both) or a negative one (no limiter) takes it.
func TestKubeAPIBurstZero(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--kube-api-burst", "0"}, false},
		{[]string{"--kube-api-burst", "0", "--kube-api-qps", "0"}, true},
		{[]string{"--kube-api-burst", "0", "--kube-api-qps", "-1"}, true},
	} {
		o := parsedOptions(t, append([]string{"--master", "https://127.0.0.1:1"}, tc.args...))
		_, verr := o.validate()
		_, cerr := apiClient(o)
		if (verr == nil) != tc.ok || cerr != nil && verr == nil {
			t.Errorf("%q: validation %v, client %v; want valid %v, and a client whenever valid", tc.args, verr, cerr, tc.ok)
		}
		if !tc.ok && (verr == nil || !strings.Contains(verr.Error(), "--kube-api-burst")) {
			t.Errorf("%q: validation %v, want --kube-api-burst named", tc.args, verr)
		}
	}
}

// The API client's connections carry apiLiveness (keep-alive after 5 s
// idle, TCP_USER_TIMEOUT 11 s), so that one without an HTTP/2 health check
// (HTTP/1.1) that goes nowhere is given up within seconds: with client-go's
// dialer (keep-alive after 30 s, then 15 s × 9) a watch on it hung 165 s.
func TestAPIClientConnectionsFindADeadPeer(t *testing.T) {
	var mu sync.Mutex
	var client string // the client's address, as the server sees it
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		client = r.RemoteAddr
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"ServiceList","apiVersion":"v1","metadata":{},"items":[]}`))
	}))
	defer api.Close()
	c, err := apiClient(parsedOptions(t, []string{"--master", api.URL}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Services("").List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	addr := netip.MustParseAddrPort(client)
	mu.Unlock()
	fd := socketBoundTo(t, addr)
	for _, o := range []struct {
		name       string
		level, opt int
		want       int
	}{
		{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 5},
		{"TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 2},
		{"TCP_USER_TIMEOUT", unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 11000},
	} {
		if got, err := unix.GetsockoptInt(fd, o.level, o.opt); err != nil || got != o.want {
			t.Errorf("the API connection's %s: %d (%v), want %d", o.name, got, err, o.want)
		}
	}
}

// socketBoundTo is this process's socket whose local address is addr.
func socketBoundTo(t *testing.T, addr netip.AddrPort) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			continue
		}
		if in4, ok := sa.(*unix.SockaddrInet4); ok && netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)) == addr {
			return fd
		}
	}
	t.Fatalf("no socket of this process bound to %v", addr)
	return -1
}
