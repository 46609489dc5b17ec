package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

func nameServer(t *testing.T, ip, name string) string {
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
			io.WriteString(c, name+"\n")
			c.Close()
		}
	}()
	return ln.Addr().String()
}

const webManifest = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: %s, protocol: TCP}]
endpoints:
- addresses: [%s]
`

func writeWeb(t *testing.T, dir, backend string) {
	t.Helper()
	host, port, _ := net.SplitHostPort(backend)
	tmp := filepath.Join(dir, ".web.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf(webManifest, port, host)), 0o644); err != nil {
		t.Fatal(err)
	}
	// Rename into place, as editors and kubectl-style tools do.
	if err := os.Rename(tmp, filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
}

func ask(addr string) string {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// loopbackOptions are a test's options: manifests in dir, no rules, proxy
// sockets on bind, the servers on free loopback ports.
func loopbackOptions(dir, bind string) *options {
	o := newOptions()
	o.manifests = dir
	o.iptables = false
	o.bindAddress = bind
	o.healthzBindAddress = "127.0.0.1:0"
	o.metricsBindAddress = "127.0.0.1:0"
	return o
}

// runProxy runs the command's wiring (run) with o until the test ends, and
// returns its proxier once it started.
func runProxy(t *testing.T, o *options) *proxier.Proxier {
	t.Helper()
	v, err := o.validate()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	started := make(chan *proxier.Proxier, 1)
	go func() { done <- run(ctx, o, v, func(p *proxier.Proxier, _ string) { started <- p }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	select {
	case p := <-started:
		return p
	case err := <-done:
		t.Fatalf("run returned before starting: %v", err)
		return nil
	}
}

// TestManifestChangeLiveWithinOneSecond runs the whole binary's wiring with
// --manifests and --iptables=false and moves the Service's only endpoint by
// rewriting the manifest file.
func TestManifestChangeLiveWithinOneSecond(t *testing.T) {
	a := nameServer(t, "127.0.0.2", "a")
	b := nameServer(t, "127.0.0.3", "b")
	dir := t.TempDir()
	writeWeb(t, dir, a)

	o := loopbackOptions(dir, "127.0.0.1")
	p := runProxy(t, o)

	var addr string
	deadline := time.Now().Add(5 * time.Second)
	for {
		if port, ok := p.ProxyPort("default/web:http"); ok {
			addr = fmt.Sprintf("127.0.0.1:%d", port)
			if ask(addr) == "a" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("service not served from the initial manifests")
		}
		time.Sleep(10 * time.Millisecond)
	}

	start := time.Now()
	writeWeb(t, dir, b)
	for ask(addr) != "b" {
		if time.Since(start) > 3*time.Second {
			t.Fatalf("manifest change not live after %v", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
	latency := time.Since(start)
	t.Logf("manifest change live after %v", latency.Round(time.Millisecond))
	if latency > time.Second {
		t.Fatalf("manifest change took %v, want < 1s", latency)
	}
}

func TestBadFlagsExitTwo(t *testing.T) {
	tests := [][]string{
		{"--proxy-mode", "iptables"},
		{"--bind-address", "not-an-ip", "--manifests", "."},
		{"--proxy-port-range", "9-3"},
		{"--udp-timeout", "0s"},
		{"--udp-max-sessions-per-port", "0"},
		{"--udp-max-sessions", "-1"},
		{"--udp-max-sessions", "many"},
		{"--tcp-keepalive-idle", "-1s"},
		{"--tcp-keepalive-interval", "0s"},
		{"--tcp-keepalive-count", "0"},
		{"--tcp-user-timeout", "-5s"},
		{"--tcp-write-timeout", "soon"},
		{"--max-connection-age", "-1m"},
		{"--connection-close-quiet", "0s"},
		{"--connection-close-deadline", "-1s"},
		{"--iptables-min-sync-period", "1m", "--iptables-sync-period", "30s"},
		{"--nodeport-addresses", "10.0.0.0"},
		{"--nodeport-addresses", "primary,10.0.0.0/8,primary"},
		{"--manifests", ".", "--cluster-cidr", "10.244.0.0"},
		{"--manifests", ".", "--cluster-cidr", "10.244.0.0/16,10.245.0.0/16"},
		{"--no-such-flag"},
		{"--manifests", ".", "--kubeconfig", "/x"},
		{"--kubeconfig", "/nonexistent/kubeconfig"},        // was exit 1, at the client's start
		{"--master", "not a url", "--init-only"},           // was exit 0, then exit 1 at the client's start
		{"--master", "ftp://10.0.0.1:6443", "--init-only"}, // was retried forever
		{"--master", "http://[::1", "--init-only"},         // was exit 0, then exit 1 at the client's start
		{"--master", "http://h:99999", "--init-only"},      // was exit 0, then a dial that cannot work
		{"--manifests", ".", "--kube-api-burst", "-1"},
		{"--manifests", ".", "--service-cluster-ip-range", "10.96.0.0"},
		{"--manifests", ".", "--service-cluster-ip-range", "10.0.0.0/8,10.1.0.0/16"},
		{"stray-argument"},
	}
	for _, args := range tests {
		if code := runMain(args); code != exitUsage {
			t.Errorf("runMain(%q) = %d, want %d", args, code, exitUsage)
		}
	}
}

// TestNodeName: kube-proxy trims and lowercases the node name, an override
// too; endpoints' nodeName and the Node object are lower case.
func TestNodeName(t *testing.T) {
	for override, want := range map[string]string{
		"node-1":    "node-1",
		"Node-1":    "node-1",
		" node-1\n": "node-1",
	} {
		if got := nodeName(override); got != want {
			t.Errorf("nodeName(%q) = %q, want %q", override, got, want)
		}
	}
}

// A zoned link-local --bind-address is refused for its zone, and the
// link-local advice beside it does not hand the zone back: it said
// "bind :: (with --node-ip fe80::1%eth0 ...)", a value refused in turn.
func TestZonedLinkLocalBindAddressAdviceHasNoZone(t *testing.T) {
	err := checkValidate(t, "zoned link-local", []string{"--bind-address", "fe80::1%eth0"}, "IPv6 zone ids are not supported")
	if err != nil && strings.Contains(err.Error(), "--node-ip fe80::1%eth0") {
		t.Errorf("the advice gives back the refused zone:\n%v", err)
	}
}

// Flags that could never work are refused at start with a message naming
// the flag; their working neighbours stay accepted.
func TestBindAndNodeIPValidation(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string // "" = valid
	}{
		{[]string{"--bind-address", "127.0.0.1"}, "--bind-address 127.0.0.1 is a loopback address"},
		{[]string{"--bind-address", "127.0.0.2", "--iptables=true"}, "loopback"},
		{[]string{"--bind-address", "::1"}, "loopback"},
		{[]string{"--bind-address", "::ffff:127.0.0.1"}, "loopback"},
		{[]string{"--bind-address", "127.0.0.1", "--iptables=false"}, ""}, // the README's first run
		{[]string{"--bind-address", "127.0.0.1", "--cleanup"}, ""},
		{[]string{"--bind-address", "fe80::1%eth0", "--iptables=false"}, "--bind-address \"fe80::1%eth0\": IPv6 zone ids are not supported"},
		{[]string{"--node-ip", "fe80::1%eth0"}, "--node-ip \"fe80::1%eth0\": IPv6 zone ids are not supported"},
		// A socket cannot listen on a link-local address without its
		// interface (EINVAL at every sync, nothing served), and the zone
		// that would name it is refused above.
		{[]string{"--bind-address", "fe80::1"}, "--bind-address fe80::1 is an IPv6 link-local address"},
		{[]string{"--bind-address", "fe80::1", "--iptables=false"}, "link-local"},
		{[]string{"--bind-address", "fe80::1", "--cleanup"}, ""},
		{[]string{"--bind-address", "fd00:1::10"}, ""},
		{[]string{"--bind-address", "169.254.1.1"}, ""}, // IPv4 link-local binds without a zone
		{[]string{"--node-ip", "fe80::1"}, ""},
		{[]string{"--node-ip", "127.0.0.1"}, "--node-ip 127.0.0.1 is a loopback address"},
		{[]string{"--node-ip", "::ffff:127.0.0.1"}, "loopback"},
		{[]string{"--node-ip", "::1"}, "loopback"},
		{[]string{"--node-ip", "127.0.0.1", "--iptables=false"}, ""},
		{[]string{"--node-ip", "0.0.0.0"}, "--node-ip 0.0.0.0 is not an address of the node"},
		{[]string{"--bind-address", "10.0.0.1"}, ""},
		{[]string{"--proxy-port-range", "0"}, ""},
		{[]string{"--proxy-port-range", "0-0"}, ""},
		{[]string{"--proxy-port-range", "30000"}, ""},
		{[]string{"--proxy-port-range", "30000+9"}, ""},
		{[]string{"--tcp-keepalive-idle", "0", "--tcp-keepalive-count", "0"}, ""}, // keep-alive off: the rest unused
		{[]string{"--tcp-keepalive-count", "0"}, "--tcp-keepalive-count must be greater than 0"},
		{[]string{"--tcp-keepalive-interval", "1500ms"}, "--tcp-keepalive-interval must be whole seconds"},
		{[]string{"--tcp-keepalive-idle", "90500ms"}, "--tcp-keepalive-idle must be whole seconds"},
		{[]string{"--tcp-keepalive-idle", "0", "--tcp-keepalive-interval", "1500ms"}, ""}, // keep-alive off
		{[]string{"--tcp-keepalive-idle", "2m", "--tcp-keepalive-interval", "15s"}, ""},
		{[]string{"--tcp-user-timeout", "0", "--tcp-write-timeout", "0"}, ""},
		{[]string{"--connection-close-deadline", "0"}, ""}, // wait for quiet however long
		{[]string{"--connection-close-deadline", "-1s"}, "--connection-close-deadline must not be negative, got -1s"},
		{[]string{"--hostname-override", " \n"}, "--hostname-override \" \\n\" is blank"},
		{[]string{"--hostname-override", "Node-1"}, ""},
		{[]string{"--iptables-min-sync-period", "0"}, ""}, // kube-proxy's "no minimum"
		{[]string{"--iptables-min-sync-period", "-1s"}, "--iptables-min-sync-period must not be negative, got -1s"},
	}
	for _, tt := range tests {
		args := append([]string{"--manifests", t.TempDir()}, tt.args...)
		err := checkValidate(t, fmt.Sprintf("%q", tt.args), args, tt.wantErr)
		if tt.wantErr != "" && err != nil { // a flag set that validates would run the proxy
			if code := runMain(args); code != exitUsage {
				t.Errorf("runMain(%q) = %d, want %d", tt.args, code, exitUsage)
			}
		}
	}
}

func TestParseDefaultRouteInterface(t *testing.T) {
	table := "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n" +
		"eth1\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n" +
		"eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
	if got := parseDefaultRouteInterface(table); got != "eth0" {
		t.Fatalf("got %q, want eth0", got)
	}
	if got := parseDefaultRouteInterface("Iface\tDestination\n"); got != "" {
		t.Fatalf("got %q for a table without default route", got)
	}
}

// --cluster-cidr (kube-proxy's: one CIDR, or one per family) reaches both
// families' rules, masked.
func TestClusterCIDRReachesTheRules(t *testing.T) {
	o := newOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse([]string{"--manifests", t.TempDir(), "--cluster-cidr", "10.244.1.0/16, fd00:244::1/56"}); err != nil {
		t.Fatal(err)
	}
	v, err := o.validate()
	if err != nil {
		t.Fatal(err)
	}
	cfg4, cfg6, _ := portalConfigs(v)
	want := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}
	if !slices.Equal(cfg4.ClusterCIDRs, want) || !slices.Equal(cfg6.ClusterCIDRs, want) {
		t.Fatalf("cluster CIDRs %v / %v, want %v in both", cfg4.ClusterCIDRs, cfg6.ClusterCIDRs, want)
	}
}

func TestParseDefaultRoute6Interface(t *testing.T) {
	const route = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0\n"
	const onLink = "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n"
	const reject = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n"
	for _, tt := range []struct{ table, want string }{
		{onLink + route, "eth0"},
		{reject + onLink, ""},
		{reject + route, "eth0"},
		{"", ""},
	} {
		if got := parseDefaultRoute6Interface(tt.table); got != tt.want {
			t.Errorf("parseDefaultRoute6Interface(%q) = %q, want %q", tt.table, got, tt.want)
		}
	}
}

// Each family gets its own node IP: the flag's when it is of that family,
// a specific bind address of that family, else that family's default
// route. An IPv6 --node-ip used to leave IPv4 without one, and IPv6 never
// had one (REDIRECT).
func TestNodeIPPerFamily(t *testing.T) {
	a := netip.MustParseAddr
	route4, route6 := a("192.168.50.10"), a("fd00:50::10")
	tests := []struct {
		name         string
		nodeIP, bind string
		want4, want6 string
	}{
		{"defaults: both default routes", "", "0.0.0.0", "192.168.50.10", "fd00:50::10"},
		{"IPv4 --node-ip", "10.0.0.5", "0.0.0.0", "10.0.0.5", "fd00:50::10"},
		{"IPv6 --node-ip", "fd00::5", "0.0.0.0", "192.168.50.10", "fd00::5"},
		{"bind ::", "", "::", "192.168.50.10", "fd00:50::10"},
		{"specific IPv4 bind", "", "10.0.0.7", "10.0.0.7", ""},
		{"specific IPv6 bind", "", "fd00::7", "", "fd00::7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := &validated{bind: a(tt.bind)}
			if tt.nodeIP != "" {
				v.nodeIP = a(tt.nodeIP)
			}
			got4 := nodeIPOf(v, false, func() netip.Addr { return route4 })
			got6 := nodeIPOf(v, true, func() netip.Addr { return route6 })
			str := func(x netip.Addr) string {
				if !x.IsValid() {
					return ""
				}
				return x.String()
			}
			if str(got4) != tt.want4 || str(got6) != tt.want6 {
				t.Errorf("node IPs %q / %q, want %q / %q", str(got4), str(got6), tt.want4, tt.want6)
			}
		})
	}
}

// --nodeport-addresses primary is each family's --node-ip, else its
// default-route address, never --bind-address (where proxy sockets listen);
// the NodePort portals and the healthCheckNodePort servers both follow it.
// A loopback bind address left NodePorts on every address, and an IPv4 one
// left IPv6 unrestricted.
func TestNodePortAddressesPrimary(t *testing.T) {
	a := netip.MustParseAddr
	route4, route6 := a("192.0.2.2"), a("fd00::2")
	tests := []struct {
		name, bind, nodeIP string
		noRoute6           bool
		want               []string
		wantListen         []healthcheck.ListenAddr
	}{
		{name: "loopback bind", bind: "127.0.0.1", want: []string{"192.0.2.2/32", "fd00::2/128"}},
		{name: "IPv4 bind", bind: "192.0.2.9", want: []string{"192.0.2.2/32", "fd00::2/128"}},
		{name: "IPv6 bind", bind: "fd00::9", want: []string{"192.0.2.2/32", "fd00::2/128"}},
		{name: "all", bind: "0.0.0.0", want: []string{"192.0.2.2/32", "fd00::2/128"}},
		{name: "IPv4 --node-ip", bind: "127.0.0.1", nodeIP: "192.0.2.7", want: []string{"192.0.2.7/32", "fd00::2/128"}},
		{name: "IPv6 --node-ip", bind: "0.0.0.0", nodeIP: "fd00::7", want: []string{"192.0.2.2/32", "fd00::7/128"}},
		// As kube-proxy: a family without a primary IP is not restricted.
		{name: "no IPv6 route", bind: "127.0.0.1", noRoute6: true, want: []string{"192.0.2.2/32"},
			wantListen: []healthcheck.ListenAddr{{Network: "tcp", Host: "192.0.2.2"}, {Network: "tcp6", Host: "::"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := &validated{bind: a(tt.bind), nodePortPrimary: true}
			if tt.nodeIP != "" {
				v.nodeIP = a(tt.nodeIP)
			}
			r6 := route6
			if tt.noRoute6 {
				r6 = netip.Addr{}
			}
			saved := defaultRoutes
			defaultRoutes.v4, defaultRoutes.v6 = func() netip.Addr { return route4 }, func() netip.Addr { return r6 }
			t.Cleanup(func() { defaultRoutes = saved })
			resolveNodePortAddresses(v)
			var want []netip.Prefix
			for _, p := range tt.want {
				want = append(want, netip.MustParsePrefix(p))
			}
			if !slices.Equal(v.nodePortAddresses, want) {
				t.Fatalf("--bind-address %s --node-ip %q: NodePort addresses %v, want %v", tt.bind, tt.nodeIP, v.nodePortAddresses, want)
			}
			cfg4, cfg6, _ := portalConfigs(v)
			if !slices.Equal(cfg4.NodePortAddresses, want) || !slices.Equal(cfg6.NodePortAddresses, want) {
				t.Errorf("portals' NodePort addresses %v / %v, want %v", cfg4.NodePortAddresses, cfg6.NodePortAddresses, want)
			}
			// The node holds both primary IPs, the bind address and loopback.
			ifAddrs := func() ([]net.Addr, error) {
				var out []net.Addr
				for _, s := range []string{"127.0.0.1/8", "::1/128", "192.0.2.2/24", "192.0.2.7/24", "192.0.2.9/24", "fd00::2/64", "fd00::7/64", "fd00::9/64"} {
					ip, n, _ := net.ParseCIDR(s)
					out = append(out, &net.IPNet{IP: ip, Mask: n.Mask})
				}
				return out, nil
			}
			wantListen := tt.wantListen
			if wantListen == nil {
				for _, p := range want {
					wantListen = append(wantListen, healthcheck.ListenAddr{Network: "tcp", Host: p.Addr().String()})
				}
			}
			if got := healthcheck.ListenAddrs(v.nodePortAddresses, ifAddrs); !slices.Equal(got, wantListen) {
				t.Errorf("healthCheckNodePorts listen on %v, want %v", got, wantListen)
			}
		})
	}
}

// A --bind-address no interface holds is warned about at start, naming the
// flag and the address, as --node-ip is: every proxy socket failed to
// listen and nothing said why. Loopback and the wildcards are not warned.
func TestBindAddressNotLocalWarned(t *testing.T) {
	logs := captureKlog(t)
	o := newOptions()
	o.manifests = t.TempDir()
	o.iptables = false
	o.bindAddress = "198.51.100.7" // TEST-NET-2: no interface of a test host holds it
	o.healthzBindAddress = ""
	o.metricsBindAddress = ""
	v, err := o.validate()
	if err != nil {
		t.Fatal(err)
	}
	runStarted(t, o, v, "a warning, not an error, is wanted")()
	klog.Flush()
	var warned bool
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "Warning: --bind-address") && strings.Contains(l, `bindAddress="198.51.100.7"`) {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no start-up warning names --bind-address 198.51.100.7; log:\n%s", logs)
	}

	for _, bind := range []string{"0.0.0.0", "::", "127.0.0.2", "::1"} {
		before := len(logs.String())
		warnBindAddressNotLocal(netip.MustParseAddr(bind), func(netip.Addr) bool { return false })
		klog.Flush()
		if l := logs.String()[before:]; strings.Contains(l, "--bind-address") {
			t.Errorf("--bind-address %s warned about: %s", bind, l)
		}
	}
}

// --state-file keeps what an API server gave: refused beside --manifests,
// which reads none; its grace must not be negative.
func TestStateFileFlags(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state.json")
	manifests := t.TempDir()
	tests := []struct {
		args    []string
		wantErr string // "" = valid
	}{
		{[]string{"--kubeconfig", kubeconfig, "--state-file", state}, ""},
		{[]string{"--kubeconfig", kubeconfig, "--state-file", state, "--state-file-grace", "0"}, ""},
		{[]string{"--kubeconfig", kubeconfig, "--state-file", state, "--state-file-grace", "-1s"}, "--state-file-grace must not be negative, got -1s"},
		{[]string{"--manifests", manifests, "--state-file", state}, "--state-file keeps what an API server gave, and --manifests reads no API server"},
		{[]string{"--manifests", manifests, "--state-file", state, "--cleanup"}, ""},
	}
	for _, tt := range tests {
		_, err := parsedOptions(t, tt.args).validate()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%q: refused: %v", tt.args, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%q: error %v, want one containing %q", tt.args, err, tt.wantErr)
		}
		if tt.wantErr != "" && err != nil {
			if code := runMain(tt.args); code != exitUsage {
				t.Errorf("runMain(%q) = %d, want %d", tt.args, code, exitUsage)
			}
		}
	}
}

// With --iptables=false no rule is written, so syncs are rate-limited to
// 100 ms only: a stream of new Services is each served as it arrives. With the
// 1 s minimum and kube-proxy's burst of 2, the third of three changes
// within a second waited for its token: up to 1.09 s after its write
// (measured by a sweep), past the manifests' 1 s.
//
// Judged by what a 1 s limit does for sure, not by how late a Service may
// be: once its burst is spent, it serves the Services (each written only
// once the one before is served) at least 1 s apart, a token bucket never
// being early; unlimited, they come about 250 ms apart. The check was
// "each served within 600 ms of its write", which a loaded machine broke
// (1.08 s and 2.34 s, the manifest reads alone 0.2-2.4 s apart), and
// which the limit itself broke only by a few hundred ms.
func TestServiceStreamEachServedAtOnceWithoutIptables(t *testing.T) {
	dir := t.TempDir()
	o := loopbackOptions(dir, "127.0.0.1")
	p := runProxy(t, o)
	const svc = "apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: default}\nspec:\n  clusterIP: 10.96.1.%d\n  ports: [{name: http, port: 80}]\n"
	var worst time.Duration
	var served []time.Time
	for i := 1; i <= 8; i++ {
		name := fmt.Sprintf("default/s%d:http", i)
		written := time.Now()
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%d.yaml", i)), []byte(fmt.Sprintf(svc, i, i)), 0o644); err != nil {
			t.Fatal(err)
		}
		for {
			if _, ok := p.ProxyPort(name); ok {
				break
			}
			if time.Since(written) > 5*time.Second {
				t.Fatalf("%s not served 5 s after its manifest was written", name)
			}
			time.Sleep(5 * time.Millisecond)
		}
		worst = max(worst, time.Since(written))
		served = append(served, time.Now())
		time.Sleep(250*time.Millisecond - time.Since(written)%(250*time.Millisecond))
	}
	// The gaps after the third Service: by then a burst of 2 is spent.
	var gaps []time.Duration
	for i := 3; i < len(served); i++ {
		gaps = append(gaps, served[i].Sub(served[i-1]).Round(time.Millisecond))
	}
	t.Logf("slowest of 8 Services written 250 ms apart: served %v after its write; served apart by %v", worst.Round(time.Millisecond), gaps)
	if slices.Min(gaps) >= 800*time.Millisecond {
		t.Errorf("Services written 250 ms apart were served %v apart, none less than 800 ms: syncs rate-limited as with rules (1 s apart)", gaps)
	}
}

// The minimum between syncs rate-limits iptables-restore: without rules
// its default is 100 ms, and a value given, by flag or by --config, applies.
func TestEffectiveMinSyncPeriod(t *testing.T) {
	for _, tc := range []struct {
		iptables, given bool
		want            time.Duration
	}{
		{true, false, time.Second},
		{true, true, 3 * time.Second},
		{false, false, noRulesMinSyncPeriod},
		{false, true, 3 * time.Second},
	} {
		o := newOptions()
		o.iptables = tc.iptables
		if tc.given {
			o.minSyncPeriod, o.minSyncPeriodGiven = 3*time.Second, true
		}
		if got := o.effectiveMinSyncPeriod(); got != tc.want {
			t.Errorf("iptables %v, given %v: %v, want %v", tc.iptables, tc.given, got, tc.want)
		}
	}
}

// A --master that has a scheme but does not parse is refused in the
// user's own words: client-go's message quoted it as
// "http://http://%zz".
func TestMasterURLErrorQuotesTheValue(t *testing.T) {
	for _, master := range []string{"http://%zz", "https://[::1", "http://a b"} {
		err := checkMasterURL(master)
		if err == nil {
			t.Fatalf("checkMasterURL(%q) accepted it", master)
		}
		if msg := err.Error(); strings.Count(msg, "://") != 1 || !strings.Contains(msg, master) {
			t.Errorf("checkMasterURL(%q) = %q; want the value quoted as given", master, msg)
		}
	}
}

// --master takes what client-go takes: a URL with http or https, or a
// host[:port] (http:// assumed), with a port 1-65535. Whatever client-go's
// DefaultServerURL refuses is refused here too: 'http://[::1' and
// 'http://a b' passed the check (they were re-read as http://http://...)
// and the start exited 1.
func TestMasterURL(t *testing.T) {
	for _, tc := range []struct {
		master string
		ok     bool
	}{
		{"https://10.0.0.1:6443", true}, {"http://127.0.0.1:8080", true}, {"10.0.0.1:6443", true},
		{"localhost", true}, {"localhost:6443", true}, {"https://k8s.example.com/prefix", true},
		{"https://[::1]:6443", true}, {"[fe80::1%25lo]:6443", true}, {"http://h:65535", true},
		{"not a url", false}, {"ftp://10.0.0.1", false}, {"https://", false},
		{"http://[::1", false}, {"http://a b", false}, {"http://h:99999", false},
		{"h:99999", false}, {"http://h:0", false}, {"[::1]:70000", false}, {"h/prefix", false},
	} {
		err := checkMasterURL(tc.master)
		if (err == nil) != tc.ok {
			t.Errorf("checkMasterURL(%q) = %v, want ok %v", tc.master, err, tc.ok)
		}
		if _, _, cerr := rest.DefaultServerURL(tc.master, "", schema.GroupVersion{}, false); cerr != nil && err == nil {
			t.Errorf("checkMasterURL(%q) accepts what client-go refuses: %v", tc.master, cerr)
		}
	}
}

// The health timeout is two sync periods, and a sync period meant as
// "never" (2562047h) keeps it the largest: doubled plainly it wrapped to
// -2ns, and any change queued for a moment failed /healthz and /livez.
func TestHealthTimeoutSaturates(t *testing.T) {
	for _, tc := range []struct{ period, want time.Duration }{
		{30 * time.Second, time.Minute},
		{math.MaxInt64, math.MaxInt64},
		{2562047 * time.Hour, math.MaxInt64},
	} {
		if got := healthTimeout(tc.period); got != tc.want {
			t.Errorf("healthTimeout(%v) = %v, want %v", tc.period, got, tc.want)
		}
	}
}

// --service-node-port-range is kube-apiserver's flag with its syntax
// (BEGIN-END, BEGIN+N, one port; empty: the default): a cluster whose API
// server hands out node ports from another range could not describe its
// NodePort Services in --manifests, whose range was fixed at 30000-32767.
// A bad value is a usage error naming the flag.
func TestServiceNodePortRangeFlag(t *testing.T) {
	tests := []struct {
		value   string
		want    config.PortRange
		wantErr string // "" = valid
	}{
		{"20000-22767", config.PortRange{Min: 20000, Max: 22767}, ""},
		{"20000+2767", config.PortRange{Min: 20000, Max: 22767}, ""},
		{" 30080 ", config.PortRange{Min: 30080, Max: 30080}, ""},
		{"", config.DefaultNodePortRange, ""}, // as kube-apiserver: unset is the default
		{"0", config.PortRange{}, `--service-node-port-range: "0" names no port`},
		{"0-0", config.PortRange{}, `--service-node-port-range: "0-0" names no port`},
		{"30000-", config.PortRange{}, "--service-node-port-range: invalid port range \"30000-\": END is missing"},
		{"32767-30000", config.PortRange{}, "--service-node-port-range: invalid port range \"32767-30000\""},
		{"1-70000", config.PortRange{}, "--service-node-port-range: invalid port range \"1-70000\""},
		{"ports", config.PortRange{}, "--service-node-port-range: invalid port range \"ports\""},
	}
	for _, tt := range tests {
		args := []string{"--manifests", t.TempDir(), "--service-node-port-range", tt.value}
		v, err := parsedOptions(t, args).validate()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%q: refused: %v", tt.value, err)
		case tt.wantErr == "" && v.nodePorts != tt.want:
			t.Errorf("%q: range %v, want %v", tt.value, v.nodePorts, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%q: error %v, want one containing %q", tt.value, err, tt.wantErr)
		case tt.wantErr != "":
			if code := runMain(args); code != exitUsage {
				t.Errorf("runMain(%q) = %d, want %d", args, code, exitUsage)
			}
		}
	}
	if v, err := parsedOptions(t, []string{"--manifests", t.TempDir()}).validate(); err != nil || v.nodePorts != config.DefaultNodePortRange {
		t.Errorf("without the flag: range %v (%v), want kube-apiserver's default %v", v.nodePorts, err, config.DefaultNodePortRange)
	}
}

// A --proxy-port-range over --service-node-port-range is warned about once
// at start, naming both: its ports that are NodePorts are skipped, and a
// proxy socket moves off a port that becomes one (nothing said so).
func TestProxyPortRangeOverNodePortsWarned(t *testing.T) {
	logs := captureKlog(t)
	manifests := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string // "": no warning
	}{
		{[]string{"--proxy-port-range", "30078-30082"}, `proxyPortRange="30078-30082" serviceNodePortRange="30000-32767"`},
		{[]string{"--proxy-port-range", "22000+9999", "--service-node-port-range", "20000-22767"}, `proxyPortRange="22000-31999" serviceNodePortRange="20000-22767"`},
		{[]string{"--proxy-port-range", "40000-40009"}, ""},
		{[]string{"--proxy-port-range", "30078-30082", "--service-node-port-range", "20000-22767"}, ""},
		{nil, ""}, // the default pool stays out of the range
	} {
		o := parsedOptions(t, append([]string{"--manifests", manifests, "--iptables=false",
			"--healthz-bind-address", "", "--metrics-bind-address", ""}, tc.args...))
		v, err := o.validate()
		if err != nil {
			t.Fatal(err)
		}
		before := len(logs.String())
		runStarted(t, o, v, "a warning, not an error, is wanted")()
		klog.Flush()
		var warned []string
		for _, l := range strings.Split(logs.String()[before:], "\n") {
			if strings.Contains(l, "Warning: --proxy-port-range") {
				warned = append(warned, l)
			}
		}
		switch {
		case tc.want == "" && len(warned) > 0:
			t.Errorf("%q: warned %q", tc.args, warned)
		case tc.want != "" && (len(warned) != 1 || !strings.Contains(warned[0], tc.want)):
			t.Errorf("%q: warned %q, want one line with %s", tc.args, warned, tc.want)
		}
	}
}

// The kernel refuses TCP_KEEPIDLE and TCP_KEEPINTVL above 32767 s,
// TCP_KEEPCNT above 127 and a TCP_USER_TIMEOUT that is not a positive C int
// of milliseconds. Such values were accepted, and then every TCP proxy
// socket failed to open at every sync ("setsockopt: invalid argument",
// naming no flag) while /healthz said 200: they are refused at start, and
// the largest accepted ones work on a real socket.
func TestLivenessFlagsWithinKernelLimits(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string // "" = valid
	}{
		{[]string{"--tcp-keepalive-idle", "32767s", "--tcp-keepalive-interval", "32767s", "--tcp-keepalive-count", "127", "--tcp-user-timeout", "596h31m23.647s"}, ""},
		{[]string{"--tcp-keepalive-idle", "32768s"}, "--tcp-keepalive-idle must be at most 9h6m7s (the kernel's limit), got 9h6m8s"},
		{[]string{"--tcp-keepalive-interval", "32768s"}, "--tcp-keepalive-interval must be at most 9h6m7s"},
		{[]string{"--tcp-keepalive-count", "128"}, "--tcp-keepalive-count must be at most 127 (the kernel's limit), got 128"},
		{[]string{"--tcp-user-timeout", "600h"}, "--tcp-user-timeout must be at most 596h31m23.647s"},
		{[]string{"--tcp-keepalive-idle", "0", "--tcp-keepalive-count", "1000", "--tcp-keepalive-interval", "99999s"}, ""}, // keep-alive off: unused
	}
	for _, tt := range tests {
		args := append([]string{"--manifests", t.TempDir()}, tt.args...)
		o := parsedOptions(t, args)
		_, err := o.validate()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%q: refused: %v", tt.args, err)
			continue
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%q: error %v, want one containing %q", tt.args, err, tt.wantErr)
			continue
		case tt.wantErr != "":
			continue
		}
		l, err := (&net.ListenConfig{Control: relay.SocketControl(o.liveness())}).Listen(context.Background(), "tcp4", "127.0.0.1:0")
		if err != nil {
			t.Errorf("%q: accepted, but a proxy socket cannot listen with it: %v", tt.args, err)
			continue
		}
		l.Close()
	}
}

// kube-proxy's --nodeport-addresses takes CIDRs and the keywords primary,
// localhost and all in any combination (a keyword at most once): all,
// localhost and primary beside anything were refused, so a kube-proxy 1.37
// configuration (nodePortAddresses: [primary, localhost]) could not start.
// A family with a /0 takes every address, written as no CIDR of its own.
func TestNodePortAddressesKeywords(t *testing.T) {
	tests := []struct {
		value   string
		want    []string // the resolved CIDRs, any order
		wantErr string
	}{
		{value: "all", want: nil},
		{value: "localhost", want: []string{"127.0.0.0/8", "::1/128"}},
		{value: "primary,localhost", want: []string{"127.0.0.0/8", "::1/128", "192.0.2.2/32", "fd00::2/128"}},
		{value: "10.0.0.0/8,primary", want: []string{"10.0.0.0/8", "192.0.2.2/32", "fd00::2/128"}},
		{value: "all,localhost", want: nil},
		{value: "0.0.0.0/0", want: nil},
		{value: "0.0.0.0/0,fd00::/64,10.0.0.0/8", want: []string{"fd00::/64"}},
		{value: "primary,::/0", want: []string{"192.0.2.2/32"}},
		{value: "primary,primary", wantErr: `--nodeport-addresses: "primary" is given twice`},
		{value: "localhost,10.0.0.0/8,localhost", wantErr: `"localhost" is given twice`},
		{value: "PRIMARY", wantErr: `"PRIMARY" is not a CIDR, nor one of the keywords primary, localhost, all`},
	}
	saved := defaultRoutes
	defaultRoutes.v4 = func() netip.Addr { return netip.MustParseAddr("192.0.2.2") }
	defaultRoutes.v6 = func() netip.Addr { return netip.MustParseAddr("fd00::2") }
	t.Cleanup(func() { defaultRoutes = saved })
	for _, tt := range tests {
		args := []string{"--manifests", t.TempDir(), "--nodeport-addresses", tt.value}
		v, err := parsedOptions(t, args).validate()
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: error %v, want one containing %q", tt.value, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: refused: %v", tt.value, err)
			continue
		}
		resolveNodePortAddresses(v)
		var got []string
		for _, p := range v.nodePortAddresses {
			got = append(got, p.String())
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(tt.want))
		if !slices.Equal(got, want) {
			t.Errorf("--nodeport-addresses %s: NodePort addresses %v, want %v", tt.value, got, want)
		}
	}
}

// A --state-file that names a file holding something else (a kubeconfig,
// the --config file, any file) was replaced by the first write, within
// 10 s of the first sync, without a word: it is refused at start, before
// anything is written. A file that is not there, an empty one and one this
// proxy wrote are taken.
func TestStateFileNeverReplacesAnotherFile(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	precious := filepath.Join(dir, "precious.conf")
	if err := os.WriteFile(precious, []byte("very important, not a state file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.json")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ours := filepath.Join(dir, "state.json")
	if err := config.WriteStateFile(ours, config.State{Written: time.Now()}); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(dir, "list.json") // as kubectl get -o json writes it: read as a state file
	if err := os.WriteFile(list, []byte(`{"kind":"List","apiVersion":"v1","items":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "config.yaml") // JSON's "kind" in YAML
	if err := os.WriteFile(config, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		state   string
		wantErr string // "" = valid
	}{
		{filepath.Join(dir, "new", "state.json"), ""},
		{empty, ""},
		{ours, ""},
		{kubeconfig, "--state-file \"" + kubeconfig + "\": holds something other than a state file"},
		{precious, "holds something other than a state file"},
		{list, ""},
		{config, "holds something other than a state file"},
		{dir, "not a regular file"},
	}
	for _, tt := range tests {
		args := []string{"--kubeconfig", kubeconfig, "--state-file", tt.state}
		checkValidate(t, tt.state, args, tt.wantErr)
	}
	if data, _ := os.ReadFile(precious); string(data) != "very important, not a state file\n" {
		t.Errorf("precious.conf changed: %q", data)
	}
}

// With --iptables=false the minimum sync period in force is 100 ms unless
// one is given (README), so a sync period between it and 1 s is valid
// there: it was refused by the 1 s minimum that is not in force and was
// not given ("--iptables-min-sync-period (1s) must not exceed
// --iptables-sync-period (500ms)"). A minimum given, by flag or --config,
// is still held to the period, as kube-proxy holds it.
func TestMinSyncPeriodInForceAgainstSyncPeriod(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables: {minSyncPeriod: 2s, syncPeriod: 1s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args    []string
		wantErr string // "" = valid
	}{
		{[]string{"--iptables=false", "--iptables-sync-period", "500ms"}, ""},
		{[]string{"--iptables=false", "--iptables-sync-period", "50ms"}, "--iptables-min-sync-period (100ms) must not exceed --iptables-sync-period (50ms)"},
		{[]string{"--iptables=false", "--iptables-min-sync-period", "2s", "--iptables-sync-period", "1s"}, "--iptables-min-sync-period (2s) must not exceed"},
		{[]string{"--iptables=false", "--config", cfg}, "--iptables-min-sync-period (2s) must not exceed --iptables-sync-period (1s)"},
		{[]string{"--iptables-sync-period", "500ms"}, "--iptables-min-sync-period (1s) must not exceed --iptables-sync-period (500ms)"}, // as kube-proxy
	}
	for _, tt := range tests {
		args := append([]string{"--manifests", t.TempDir()}, tt.args...)
		checkValidate(t, fmt.Sprintf("%q", tt.args), args, tt.wantErr)
		// The check of a changed --config agrees with the start.
		if cerr := configChecker(append(slices.Clone(args), "--config", cfg))([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables: {minSyncPeriod: 2s, syncPeriod: 1s}\n")); cerr == nil {
			t.Errorf("%q: the --config check takes minSyncPeriod 2s over syncPeriod 1s", tt.args)
		}
	}
}

// Two of the proxy's own servers on one address can never both listen:
// `--metrics-bind-address 0.0.0.0:10256` (the health server's default)
// was accepted, and then the metrics server was retried every 5 s for good
// (with --bind-address-hard-fail: exit 1 after the start). Refused at start,
// naming both flags; servers on one port of different specific addresses,
// port 0 and a disabled server are fine.
func TestServersOnOneAddressRefused(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string // "" = valid
	}{
		{[]string{"--metrics-bind-address", "0.0.0.0:10256"}, "--healthz-bind-address (0.0.0.0:10256) and --metrics-bind-address (0.0.0.0:10256) cannot both listen there"},
		{[]string{"--metrics-bind-address", "127.0.0.1:10256"}, "--healthz-bind-address (0.0.0.0:10256) and --metrics-bind-address (127.0.0.1:10256)"},
		{[]string{"--fault-api-bind-address", "127.0.0.1:10249"}, "--metrics-bind-address (127.0.0.1:10249) and --fault-api-bind-address (127.0.0.1:10249)"},
		{[]string{"--healthz-bind-address", "[::]:8474", "--fault-api-bind-address", "10.0.0.1:8474"}, "--healthz-bind-address ([::]:8474) and --fault-api-bind-address"},
		{[]string{"--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "[::1]:10256"}, ""},
		{[]string{"--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0"}, ""},
		{[]string{"--healthz-bind-address", "", "--metrics-bind-address", "0.0.0.0:10256"}, ""},
		{[]string{"--healthz-port", "0", "--metrics-bind-address", "0.0.0.0:10256"}, ""},
		{[]string{"--fault-api-bind-address", "127.0.0.1:8474"}, ""},
	}
	for _, tt := range tests {
		args := append([]string{"--manifests", t.TempDir()}, tt.args...)
		checkValidate(t, fmt.Sprintf("%q", tt.args), args, tt.wantErr)
	}
}

// Every mistake is reported at once, one line each, in the order the
// checks have always run (the validators' split into options_validate.go
// moved --node-ip's ahead of the others for a while).
func TestValidateReportsEveryMistakeInOrder(t *testing.T) {
	_, err := parsedOptions(t, []string{"--manifests", t.TempDir(), "--data-path", "x", "--hostname-override", " ",
		"--udp-timeout", "0", "--http-idle-timeout", "0", "--node-ip", "y"}).validate()
	if err == nil {
		t.Fatal("validate accepted five mistakes")
	}
	var got []string
	for line := range strings.Lines(err.Error()) {
		got = append(got, strings.Fields(line)[0])
	}
	want := []string{"--data-path", "--hostname-override", "--udp-timeout", "--http-idle-timeout", "--node-ip"}
	if !slices.Equal(got, want) {
		t.Errorf("validate reported %q, want one line per mistake in the order %q:\n%v", got, want, err)
	}
}

// A fault API that listens beyond loopback is warned about at start: anyone
// who reaches it can take every Service down (README: "Bind it to
// loopback"), and on a hostNetwork DaemonSet 0.0.0.0 is every node's
// address; it started with an info line alone.
func TestFaultAPIBeyondLoopbackWarned(t *testing.T) {
	logs := captureKlog(t)
	for addr, want := range map[string]bool{
		"0.0.0.0:8474": true, ":8474": true, "[::]:8474": true, "192.0.2.10:8474": true, "[2001:db8::1]:8474": true,
		"127.0.0.1:8474": false, "127.0.0.2:8474": false, "[::1]:8474": false, "localhost:8474": false, "": false,
	} {
		before := len(logs.String())
		warnFaultAPIBeyondLoopback(addr)
		klog.Flush()
		l := logs.String()[before:]
		if warned := strings.Contains(l, "Warning: --fault-api-bind-address"); warned != want {
			t.Errorf("--fault-api-bind-address %q: warned %v, want %v: %s", addr, warned, want, l)
		}
		if want && !strings.Contains(l, "anyone who reaches it") {
			t.Errorf("--fault-api-bind-address %q: the warning does not say why: %s", addr, l)
		}
	}
}

// The descriptor caps are logged at start after the line saying the proxy
// runs: logged by proxier.New, they were the first lines of every start,
// on any machine, before anything said what runs.
func TestLimitsLoggedAfterTheRunningLine(t *testing.T) {
	o := newOptions()
	o.manifests = t.TempDir()
	o.iptables = false
	o.bindAddress = "127.0.0.1"
	o.healthzBindAddress = ""
	o.metricsBindAddress = ""
	v, err := o.validate()
	if err != nil {
		t.Fatal(err)
	}
	logs := captureKlog(t)
	t.Cleanup(runStarted(t, o, v, "want it to start"))
	const running, tcpCap = `"kube-userspace-proxy running"`, `"TCP connections per service port capped at a quarter`
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		klog.Flush()
		out := logs.String()
		if strings.Contains(out, running) && strings.Contains(out, tcpCap) {
			at := strings.Index(out, running)
			for _, line := range []string{tcpCap, `"UDP session caps held`} {
				if i := strings.Index(out, line); i >= 0 && i < at {
					t.Errorf("%s logged before %s:\n%s", line, running, out)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log lacks %s or %s:\n%s", running, tcpCap, out)
		}
	}
}
