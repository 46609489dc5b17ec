package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/lockedbuf"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// captureKlog sends klog's output to a buffer until the test ends.
func captureKlog(t *testing.T) *lockedbuf.Buffer {
	t.Helper()
	buf := &lockedbuf.Buffer{}
	klog.LogToStderr(false)
	klog.SetOutput(buf)
	t.Cleanup(func() {
		klog.Flush()
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	return buf
}

func get(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

// The metrics address serves what kube-proxy's does besides /metrics:
// /healthz ("ok"), /proxyMode and /configz with the effective configuration
// under kube-proxy's group key. And a run without iptables does not claim on
// exit that portal rules stay behind.
func TestMetricsAddressConventionsAndStopMessage(t *testing.T) {
	logs := captureKlog(t)
	o := newOptions()
	o.manifests = t.TempDir()
	o.iptables = false
	o.bindAddress = "127.0.0.1"
	o.healthzBindAddress = ""
	o.metricsBindAddress = "127.0.0.1:0"
	o.udpTimeout = 3 * time.Second
	o.proxyPortRange = "0"
	v, err := o.validate()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	started := make(chan string, 1)
	go func() { done <- run(ctx, o, v, func(_ *proxier.Proxier, addr string) { started <- addr }) }()
	var base string
	select {
	case addr := <-started:
		base = "http://" + addr
	case err := <-done:
		t.Fatalf("run returned before starting: %v", err)
	}

	if code, h, body := get(t, base+"/healthz"); code != 200 || body != "ok" || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		t.Errorf("/healthz: %d %q %q, want 200 \"ok\" text/plain", code, h.Get("Content-Type"), body)
	}
	// kube-proxy's healthz.InstallHandler: the ping check at /healthz/ping,
	// and ?verbose lists the checks (k8s.io/apiserver pkg/server/healthz).
	for path, want := range map[string]string{
		"/healthz/ping":                  "ok",
		"/healthz?verbose":               "[+]ping ok\nhealthz check passed\n",
		"/healthz?verbose&exclude=ping":  "[+]ping excluded: ok\nhealthz check passed\n",
		"/healthz?verbose&exclude=other": "[+]ping ok\nwarn: some health checks cannot be excluded: no matches for \"other\"\nhealthz check passed\n",
	} {
		if code, _, body := get(t, base+path); code != 200 || body != want {
			t.Errorf("%s: %d %q, want 200 %q as kube-proxy's", path, code, body, want)
		}
	}
	// kube-proxy's SLI metrics (slis.SLIMetricsWithReset): the ping
	// check's results of the /healthz requests above, and the start time;
	// DELETE resets them.
	code, _, body := get(t, base+"/metrics/slis")
	for _, want := range []string{
		`kubernetes_healthcheck{name="ping",type="healthz"} 1`,
		`kubernetes_healthchecks_total{name="ping",status="success",type="healthz"}`,
		"process_start_time_seconds",
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics/slis: %d, no %s in:\n%s", code, want, body)
		}
	}
	reset, err := http.NewRequest(http.MethodDelete, base+"/metrics/slis", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(reset)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("DELETE /metrics/slis: %s, want 200 (kube-proxy's reset)", resp.Status)
	}
	if _, _, body := get(t, base+"/metrics/slis"); strings.Contains(body, "kubernetes_healthcheck{") {
		t.Errorf("/metrics/slis after DELETE still holds the checks:\n%s", body)
	}
	if code, _, body := get(t, base+"/proxyMode"); code != 200 || body != "userspace" {
		t.Errorf("/proxyMode: %d %q", code, body)
	}
	checkConfigz(t, base)

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	klog.Flush()
	out := logs.String()
	if !strings.Contains(out, "Stopped") || strings.Contains(out, "portal rules") {
		t.Errorf("with --iptables=false the stop message must not mention portal rules; log:\n%s", out)
	}
}

// Starting with no source at all is a usage error (exit 2), as the README
// says of bad flags, and says what to give.
func TestNoSourceExitsTwo(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	var code int
	stderr := capture(t, &os.Stderr, func() { code = runMain([]string{"--iptables=false"}) })
	if code != exitUsage || !strings.Contains(stderr, "no source") || !strings.Contains(stderr, "--manifests") {
		t.Fatalf("exit %d, stderr %q; want %d and a no-source message", code, stderr, exitUsage)
	}
}

// --manifests with a --config whose clientConnection.kubeconfig is set
// blames that field, not a --kubeconfig flag the user never gave.
func TestManifestsWithConfigKubeconfigNamesTheField(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"clientConnection: {kubeconfig: /etc/kube/proxy.conf}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var code int
	stderr := capture(t, &os.Stderr, func() {
		code = runMain([]string{"--config", cfg, "--manifests", t.TempDir(), "--iptables=false"})
	})
	if code != exitUsage {
		t.Fatalf("exit %d, want %d; stderr %q", code, exitUsage, stderr)
	}
	if !strings.Contains(stderr, "clientConnection.kubeconfig") || !strings.Contains(stderr, cfg) || strings.Contains(stderr, "--kubeconfig") {
		t.Fatalf("stderr %q: want the config file's field named, not --kubeconfig", stderr)
	}
}

func checkConfigz(t *testing.T, base string) {
	t.Helper()
	code, h, body := get(t, base+"/configz")
	if code != 200 || h.Get("Content-Type") != "application/json" {
		t.Errorf("/configz: %d %q %s", code, h.Get("Content-Type"), body)
		return
	}
	var cz map[string]configFile
	if err := json.Unmarshal([]byte(body), &cz); err != nil {
		t.Errorf("/configz body %s: %v", body, err)
		return
	}
	cfg, ok := cz["kubeproxy.config.k8s.io"]
	if !ok || len(cz) != 1 {
		t.Errorf("/configz keys %v, want only kubeproxy.config.k8s.io", body)
		return
	}
	if cfg.Kind != "KubeProxyConfiguration" || cfg.BindAddress != "127.0.0.1" || cfg.Mode != "userspace" ||
		cfg.MetricsBindAddress != "127.0.0.1:0" || cfg.IPTables.SyncPeriod.Duration != 30*time.Second ||
		cfg.UDPIdleTimeout == nil || cfg.UDPIdleTimeout.Duration != 3*time.Second || cfg.PortRange != "0" ||
		cfg.DetectLocalMode != "ClusterCIDR" || cfg.ClientConnection.QPS != 5 || cfg.ClientConnection.Burst != 10 ||
		cfg.ClientConnection.ContentType != "application/vnd.kubernetes.protobuf" ||
		cfg.ClientConnection.AcceptContentTypes != "application/vnd.kubernetes.protobuf,application/json" {
		t.Errorf("/configz does not hold the effective configuration: %s", body)
	}
	// kube-proxy's logging defaults, in force here too (klog's 5 s flush,
	// text output), shown as kube-proxy's /configz shows them.
	if !strings.Contains(body, `"flushFrequency":"5s"`) || !strings.Contains(body, `"format":"text"`) {
		t.Errorf("/configz logging is not kube-proxy's flushFrequency \"5s\", format \"text\": %s", body)
	}
}

// /configz reports the logging verbosity in force, as kube-proxy's shows
// its configuration's logging: -v when given, else --config's
// logging.verbosity. The command runs as itself (runMain's flag and
// --config wiring), without iptables, on loopback and ephemeral ports,
// and is stopped with SIGINT.
func TestConfigzReportsVerbosity(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"logging: {verbosity: 4, vmodule: [{filePattern: proxier, verbosity: 5}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	metricsRE := regexp.MustCompile(`"kube-userspace-proxy running".* metrics="([^"]+)"`)
	for _, tt := range []struct {
		name        string
		args        []string
		want        uint32
		wantVModule string
	}{
		{"neither", nil, 0, ""},
		{"-v given", []string{"-v=3", "--vmodule=relay*=3,faults=2"}, 3, "relay*=3,faults=2"},
		{"from --config", []string{"--config", cfg}, 4, "proxier=5"},
		// --vmodule's patterns first, then the file's, as kube-proxy joins them.
		{"-v wins over --config", []string{"--config", cfg, "-v=2", "--vmodule=relay=1"}, 2, "relay=1,proxier=5"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"-test.run=^$", "--", "--manifests", t.TempDir(), "--iptables=false",
				"--bind-address", "127.0.0.1", "--healthz-bind-address", "", "--metrics-bind-address", "127.0.0.1:0",
				"--proxy-port-range", "0"}, tt.args...)
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(os.Environ(), runAsCommand+"=1")
			var stderr lockedbuf.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done, waited := make(chan error, 1), make(chan struct{})
			go func() { done <- cmd.Wait(); close(waited) }()
			t.Cleanup(func() { _ = cmd.Process.Kill(); <-waited })
			var base string
			for deadline := time.Now().Add(time.Minute); base == ""; {
				select {
				case err := <-done:
					t.Fatalf("the command ended before it ran: %v\n%s", err, stderr.String())
				case <-time.After(20 * time.Millisecond):
				}
				if m := metricsRE.FindStringSubmatch(stderr.String()); m != nil {
					base = "http://" + m[1]
				} else if time.Now().After(deadline) {
					t.Fatalf("the command not running after 1 min:\n%s", stderr.String())
				}
			}
			code, _, body := get(t, base+"/configz")
			var cz map[string]configFile
			if err := json.Unmarshal([]byte(body), &cz); code != 200 || err != nil {
				t.Fatalf("/configz: %d %s: %v", code, body, err)
			}
			if got := uint32(cz[configzGroup].Logging.Verbosity); got != tt.want {
				t.Errorf("/configz logging.verbosity %d, want %d: %s", got, tt.want, body)
			}
			var vmodule []string
			for _, it := range cz[configzGroup].Logging.VModule {
				vmodule = append(vmodule, fmt.Sprintf("%s=%d", it.FilePattern, it.Verbosity))
			}
			if got := strings.Join(vmodule, ","); got != tt.wantVModule {
				t.Errorf("/configz logging.vmodule %q, want %q: %s", got, tt.wantVModule, body)
			}
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Errorf("the command after SIGINT: %v\n%s", err, stderr.String())
			}
		})
	}
}

// /configz shows hostnameOverride as the node name it is used as, trimmed
// and lowercased, as kube-proxy stores it ("Node-A" was shown as given).
func TestConfigzHostnameOverrideLowercased(t *testing.T) {
	o := newOptions()
	o.hostnameOverride = " Node-A\n"
	if got := o.effectiveConfig().HostnameOverride; got != "node-a" {
		t.Fatalf("hostnameOverride %q, want node-a", got)
	}
}

// A kubeconfig that is there but does not parse is bad input known before
// anything starts, as a --config that does not parse: exit 2 naming the
// flag, from the proxy and from explain, and explain does not first say it
// waits for an API server. It was exit 1, at the client's start, and
// explain printed "waiting for the API server for up to 30s" before
// failing at once.
func TestUnparsableKubeconfigExitsTwo(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters: {\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var code int
	stderr := capture(t, &os.Stderr, func() { code = runMain([]string{"--kubeconfig", kubeconfig, "--iptables=false"}) })
	if code != exitUsage || !strings.Contains(stderr, "--kubeconfig "+strconv.Quote(kubeconfig)) {
		t.Errorf("proxy: exit %d, stderr %q; want %d naming --kubeconfig", code, stderr, exitUsage)
	}
	stderr = capture(t, &os.Stderr, func() {
		code = explain(t.Context(), []string{"--kubeconfig", kubeconfig}, io.Discard)
	})
	if code != exitUsage || !strings.Contains(stderr, "--kubeconfig "+strconv.Quote(kubeconfig)) || strings.Contains(stderr, "waiting") {
		t.Errorf("explain: exit %d, stderr %q; want %d naming --kubeconfig, and no waiting line", code, stderr, exitUsage)
	}

	// One that parses and names no server cannot be used either: explain
	// fails at once (exit 1, the source could not be read), without saying
	// it waits.
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stderr = capture(t, &os.Stderr, func() {
		code = explain(t.Context(), []string{"--kubeconfig", kubeconfig}, io.Discard)
	})
	if code != 1 || !strings.Contains(stderr, "names no API server: it defines no context") || strings.Contains(stderr, "waiting") {
		t.Errorf("explain, no server: exit %d, stderr %q; want 1 with the client's error, and no waiting line", code, stderr)
	}
}
