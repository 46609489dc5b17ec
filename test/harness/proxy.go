package harness

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// Where the proxy's HTTP servers listen, on its namespace's loopback. The
// namespace is the test's own, so fixed ports cannot collide (the control
// plane's random ports are far above these).
const (
	HealthzAddr = "127.0.0.1:10256"
	MetricsAddr = "127.0.0.1:10249"
)

// Proxy is the kube-userspace-proxy binary under test, run inside a
// namespace (a Cluster's node).
type Proxy struct {
	NS   *netns.NS
	Bin  string
	Args []string    // every flag it is started with
	Proc *netns.Proc // the process of the last Start

	runs    int
	healthz *http.Client
	metrics *http.Client
}

// NewProxy describes bin run in ns with the flags every suite passes —
// userspace mode, proxy sockets on 0.0.0.0, nodeName as the node, /healthz and
// /metrics on the namespace's loopback (HealthzAddr, MetricsAddr), -v 2 —
// followed by flags: the source (--manifests DIR or --kubeconfig FILE) and
// whatever else a test sets. Nothing runs until Start.
func NewProxy(ns *netns.NS, bin, nodeName string, flags ...string) *Proxy {
	args := append([]string{
		"--proxy-mode", "userspace",
		"--bind-address", "0.0.0.0",
		"--hostname-override", nodeName,
		"--healthz-bind-address", HealthzAddr,
		"--metrics-bind-address", MetricsAddr,
		"-v", "2",
	}, flags...)
	if path := os.Getenv("KUP_TEST_DATA_PATH"); path != "" {
		// make test runs the suites once more on the event loop.
		args = append(args, "--data-path", path)
	}
	return &Proxy{NS: ns, Bin: bin, Args: args, healthz: ns.HTTPClient(time.Second), metrics: ns.HTTPClient(2 * time.Second)}
}

// Start runs the proxy (again, after it was stopped) and waits up to within
// until /healthz answers 200. It fails t, showing the proxy's output, when
// that does not happen or the process exits first. The process is killed, by
// PID, when the namespace's test ends.
func (p *Proxy) Start(t testing.TB, within time.Duration) {
	t.Helper()
	p.runs++
	p.Proc = p.NS.Start(fmt.Sprintf("kube-userspace-proxy#%d", p.runs), p.Bin, p.Args...)
	deadline := time.Now().Add(within)
	for {
		if p.Proc.Exited() {
			t.Fatalf("proxy exited during start-up: %v\n%s", p.Proc.Wait(0), p.Proc.Output())
		}
		code, body, err := p.Healthz()
		if err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy /healthz not 200 within %v (last: %d %s %v)\n%s", within, code, body, err, p.Proc.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Healthz fetches /healthz and returns its status code and body.
func (p *Proxy) Healthz() (int, string, error) {
	resp, err := p.healthz.Get("http://" + HealthzAddr + "/healthz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), err
}

// Get fetches a path from the metrics server (/metrics, /debug/services).
func (p *Proxy) Get(t testing.TB, path string) string {
	t.Helper()
	resp, err := p.metrics.Get("http://" + MetricsAddr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return string(body)
}

// Metric adds up every sample of one metric on /metrics (for a histogram,
// name its _count or _sum series).
func (p *Proxy) Metric(t testing.TB, name string) float64 {
	t.Helper()
	var sum float64
	for _, line := range strings.Split(p.Get(t, "/metrics"), "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// RequireRunning fails t when the proxy has exited.
func (p *Proxy) RequireRunning(t testing.TB) {
	t.Helper()
	if p.Proc.Exited() {
		t.Fatalf("proxy exited: %v\n%s", p.Proc.Wait(0), p.Proc.Output())
	}
}

// Lines is the proxy's output so far, one entry per line.
// The output's final newline ends the last line; it does not start an empty
// one, so len(Lines()) is the count of lines written so far.
func (p *Proxy) Lines() []string {
	return strings.Split(strings.TrimSuffix(p.Proc.Output(), "\n"), "\n")
}

// LogLines returns the proxy's output lines containing any of words
// (case-insensitive).
func (p *Proxy) LogLines(words ...string) []string { return p.LogLinesSince(0, words...) }

// LogLinesSince is LogLines over the output after its first from lines.
func (p *Proxy) LogLinesSince(from int, words ...string) []string {
	var hits []string
	lines := p.Lines()
	for _, line := range lines[min(from, len(lines)):] {
		lower := strings.ToLower(line)
		for _, w := range words {
			if strings.Contains(lower, strings.ToLower(w)) {
				hits = append(hits, line)
				break
			}
		}
	}
	return hits
}

// Rules is RulesFor on the namespace's iptables-save (IPv4).
func (p *Proxy) Rules(t testing.TB, comment string) []string {
	t.Helper()
	dump, err := p.NS.IPTablesSave(false)
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	return RulesFor(dump, comment)
}

// RulesFor returns the rules of an iptables-save dump whose comment is
// comment: a Service port's name ("namespace/name:port"), as the portal
// rules write it.
func RulesFor(dump, comment string) []string {
	var out []string
	quoted, bare := fmt.Sprintf("--comment %q ", comment), "--comment "+comment+" "
	for _, line := range strings.Split(dump, "\n") {
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		if l := line + " "; strings.Contains(l, quoted) || strings.Contains(l, bare) {
			out = append(out, line)
		}
	}
	return out
}

// Cleanup runs the binary's --cleanup in the namespace (the proxy should
// have stopped) and returns its output.
func (p *Proxy) Cleanup() (string, error) { return p.NS.Exec(p.Bin, "--cleanup", "-v", "2") }
