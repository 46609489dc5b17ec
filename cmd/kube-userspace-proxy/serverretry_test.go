package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// A health, metrics or fault API address whose port is taken is logged
// and retried in the background while the proxy serves, as kube-proxy's
// serveHealthz and serveMetrics (wait.Until, 5 s): it exited 1 ("address
// already in use"). Each server answers once its port comes free. The
// fault API's was fatal until it was retried too: any local user holding
// its port kept the proxy from ever serving, its portals' traffic meanwhile
// refused (or, before that, received by whoever held the proxy ports).
func TestTakenServerPortsRetried(t *testing.T) {
	saved := serverRetryInterval
	serverRetryInterval = 50 * time.Millisecond
	t.Cleanup(func() { serverRetryInterval = saved })
	health, metrics, faultAPI := occupy(t), occupy(t), occupy(t)

	o := newOptions()
	o.manifests = t.TempDir()
	o.iptables = false
	o.bindAddress = "127.0.0.1"
	o.healthzBindAddress = health.Addr().String()
	o.metricsBindAddress = metrics.Addr().String()
	o.faultAPIBind = faultAPI.Addr().String()
	v, err := o.validate()
	if err != nil {
		t.Fatal(err)
	}
	logs := captureKlog(t)
	t.Cleanup(runStarted(t, o, v, "want it to serve and retry the servers' taken ports"))
	// The start-up line says where metrics will be, not metrics="". run
	// writes it after the start callback runStarted waits for: poll.
	want := `metrics="` + o.metricsBindAddress + ` (not bound yet; retrying)"`
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		klog.Flush()
		if strings.Contains(logs.String(), want) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the running line does not say %s; log:\n%s", want, logs)
			break
		}
	}
	health.Close()
	metrics.Close()
	faultAPI.Close()
	for _, url := range []string{"http://" + o.healthzBindAddress + "/livez", "http://" + o.metricsBindAddress + "/proxyMode", "http://" + o.faultAPIBind + "/version"} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			resp, err := (&http.Client{Timeout: time.Second}).Get(url)
			if err == nil {
				resp.Body.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s after its port came free: %v", url, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// With --bind-address-hard-fail (kube-proxy's flag, and bindAddressHardFail
// in --config) a taken port is fatal, as there.
func TestTakenServerPortHardFail(t *testing.T) {
	taken := occupy(t)
	o := parsedOptions(t, []string{"--manifests", t.TempDir(), "--iptables=false", "--bind-address=127.0.0.1",
		"--bind-address-hard-fail", "--healthz-bind-address=" + taken.Addr().String(), "--metrics-bind-address="})
	v, err := o.validate()
	if err != nil {
		t.Fatal(err)
	}
	// Bounded: a run that retried instead would serve until the context
	// ends, and the test would hang to go test's timeout.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = run(ctx, o, v, nil)
	if err == nil || !strings.Contains(err.Error(), "--healthz-bind-address") {
		t.Fatalf("run: %v; want the taken --healthz-bind-address as an error", err)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddressHardFail: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o := parsedOptions(t, []string{"--config", path}); !o.bindAddressHardFail {
		t.Errorf("bindAddressHardFail: true in --config not taken")
	}
}

// occupy holds a loopback port until the test ends (or it is closed).
func occupy(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// runStarted runs the proxy until it has started (failing the test, with
// want, if run returns first) and returns what stops it and checks that
// it stopped cleanly.
func runStarted(t *testing.T, o *options, v *validated, want string) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() { done <- run(ctx, o, v, func(*proxier.Proxier, string) { close(started) }) }()
	select {
	case <-started:
	case err := <-done:
		cancel()
		t.Fatalf("run returned before starting: %v; %s", err, want)
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}
}

// --bind-address-hard-fail makes the fault API's taken port fatal too,
// and its help says so (it named only the health and metrics servers,
// where README's row names the fault API as well).
func TestHardFailCoversTheFaultAPI(t *testing.T) {
	help := captureStdout(t, func() { runMain([]string{"--help"}) })
	var line string
	for _, l := range strings.Split(help, "\n") {
		if strings.Contains(l, "--bind-address-hard-fail") {
			line = l
		}
	}
	if !strings.Contains(line, "fault API") {
		t.Errorf("--help of --bind-address-hard-fail does not name the fault API:\n%s", line)
	}
	taken := occupy(t)
	o := parsedOptions(t, []string{"--manifests", t.TempDir(), "--iptables=false", "--bind-address=127.0.0.1",
		"--bind-address-hard-fail", "--healthz-bind-address=", "--metrics-bind-address=", "--fault-api-bind-address=" + taken.Addr().String()})
	v, err := o.validate()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := run(ctx, o, v, nil); err == nil || !strings.Contains(err.Error(), "--fault-api-bind-address") {
		t.Fatalf("run: %v; want the taken --fault-api-bind-address as an error", err)
	}
}

// A server on a wildcard address is logged with the address as given and
// the families it takes: Go listens there with one dual-stack IPv6 socket,
// and the default --healthz-bind-address 0.0.0.0:10256 was logged as
// address="[::]:10256", read as IPv6 only. A server on one address is
// logged as before.
func TestWildcardServersLoggedAsGivenWithBothFamilies(t *testing.T) {
	o := newOptions()
	o.manifests = t.TempDir()
	o.iptables = false
	o.bindAddress = "127.0.0.1"
	o.healthzBindAddress = "0.0.0.0:0"
	o.metricsBindAddress = ":0"
	o.faultAPIBind = "127.0.0.1:0"
	v, err := o.validate()
	if err != nil {
		t.Fatal(err)
	}
	logs := captureKlog(t)
	t.Cleanup(runStarted(t, o, v, "want it to serve on wildcard addresses"))
	wants := []*regexp.Regexp{
		regexp.MustCompile(`"Health server listening" address="0\.0\.0\.0:[1-9][0-9]*" families="IPv4 and IPv6"`),
		regexp.MustCompile(`"kube-userspace-proxy running" .* metrics=":[1-9][0-9]* \(IPv4 and IPv6\)"`),
		regexp.MustCompile(`"Fault API \(Toxiproxy's REST API\) listening" address="127\.0\.0\.1:[1-9][0-9]*"\n`),
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		klog.Flush()
		missing := slices.DeleteFunc(slices.Clone(wants), func(re *regexp.Regexp) bool { return re.MatchString(logs.String()) })
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log lacks %q; log:\n%s", missing, logs)
		}
	}
}
