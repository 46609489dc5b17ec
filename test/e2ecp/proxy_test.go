package e2ecp

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// Where the proxy's HTTP servers listen, on the node namespace's loopback (the namespace
// is the test's own; the control plane's random ports are far above these).
const (
	healthzAddr = "127.0.0.1:10256"
	metricsAddr = "127.0.0.1:10249"
)

// proxy is the binary under test, running in the node namespace.
type proxy struct {
	node *netns.NS
	proc *netns.Proc
	http *http.Client
}

// startProxy runs bin in node with the API-server source and waits until /healthz is 200.
func startProxy(t *testing.T, node *netns.NS, bin, kubeconfig, nodeName string) *proxy {
	t.Helper()
	p := &proxy{node: node, http: node.HTTPClient(time.Second)}
	p.proc = node.Start("kube-userspace-proxy", bin,
		"--proxy-mode", "userspace",
		"--kubeconfig", kubeconfig,
		"--hostname-override", nodeName,
		"--bind-address", "0.0.0.0",
		"--healthz-bind-address", healthzAddr,
		"--metrics-bind-address", metricsAddr,
		"-v", "2",
	)
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body, err := p.healthz()
		if err == nil && code == http.StatusOK {
			return p
		}
		if p.proc.Exited() {
			t.Fatalf("proxy exited during start-up: %v\n%s", p.proc.Wait(0), p.proc.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy /healthz not 200 after 20 s (last: %d %s %v)\n%s", code, body, err, p.proc.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// healthz fetches /healthz and returns its status code and body.
func (p *proxy) healthz() (int, string, error) {
	resp, err := p.http.Get("http://" + healthzAddr + "/healthz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), err
}

// requireRunning fails t when the proxy has exited.
func (p *proxy) requireRunning(t *testing.T) {
	t.Helper()
	if p.proc.Exited() {
		t.Fatalf("proxy exited: %v\n%s", p.proc.Wait(0), p.proc.Output())
	}
}

// logLines returns the proxy's output lines containing any of words (case-insensitive).
func (p *proxy) logLines(words ...string) []string { return p.logLinesSince(0, words...) }

// logLinesSince is logLines over the output after its first `from` lines.
func (p *proxy) logLinesSince(from int, words ...string) []string {
	var hits []string
	lines := p.lines()
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

// lines is the proxy's output so far, one entry per line.
func (p *proxy) lines() []string { return strings.Split(p.proc.Output(), "\n") }

// rules is the node's nat table lines that carry comment, the Service port's name
// ("namespace/name:port") as the portal rules write it.
func (p *proxy) rules(t *testing.T, comment string) []string {
	t.Helper()
	dump, err := p.node.IPTablesSave(false)
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	var hits []string
	for _, line := range strings.Split(dump, "\n") {
		if strings.Contains(line, fmt.Sprintf("%q", comment)) || strings.Contains(line, "--comment "+comment+" ") {
			hits = append(hits, line)
		}
	}
	return hits
}

// metric adds up every sample of one metric on the proxy's /metrics (for a histogram,
// name its _count or _sum series).
func (p *proxy) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := p.http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
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
