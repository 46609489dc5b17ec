package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// Where the proxy's HTTP servers listen inside the node namespace. The
// namespace is ours alone, so fixed ports cannot collide.
const (
	healthzAddr = "127.0.0.1:10256"
	metricsAddr = "127.0.0.1:10249"
)

// proxy is the binary under test running in the node namespace.
type proxy struct {
	c     *netns.Cluster
	dir   string // manifests directory
	proc  *netns.Proc
	runs  int
	extra []string // flags beyond the common ones
}

// newProxy prepares a manifests directory; start launches the binary with
// the common flags plus extra.
func newProxy(t *testing.T, c *netns.Cluster, extra ...string) *proxy {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "manifests")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &proxy{c: c, dir: dir, extra: extra}
}

func (p *proxy) args() []string {
	return append([]string{
		"--proxy-mode", "userspace",
		"--manifests", p.dir,
		"--bind-address", "0.0.0.0",
		"--hostname-override", "node",
		"--healthz-bind-address", healthzAddr,
		"--metrics-bind-address", metricsAddr,
		"-v", "2",
	}, p.extra...)
}

// start runs the proxy and waits until /healthz answers 200.
func (p *proxy) start(t *testing.T) {
	t.Helper()
	p.runs++
	p.proc = p.c.Node.Start(fmt.Sprintf("kube-userspace-proxy#%d", p.runs), proxyBin, p.args()...)
	p.waitHealthy(t, 10*time.Second)
}

// waitHealthy polls /healthz until it answers 200, failing early if the
// process exits.
func (p *proxy) waitHealthy(t *testing.T, within time.Duration) {
	t.Helper()
	client := p.c.Node.HTTPClient(time.Second)
	deadline := time.Now().Add(within)
	var last string
	for time.Now().Before(deadline) {
		if p.proc.Exited() {
			t.Fatalf("proxy exited during start-up: %v\n%s", p.proc.Wait(0), p.proc.Output())
		}
		resp, err := client.Get("http://" + healthzAddr + "/healthz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("proxy /healthz not 200 within %v (last: %s)\n%s", within, last, p.proc.Output())
}

// get fetches a path from the metrics server.
func (p *proxy) get(t *testing.T, path string) string {
	t.Helper()
	resp, err := p.c.Node.HTTPClient(2 * time.Second).Get("http://" + metricsAddr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// cleanup runs `kube-userspace-proxy --cleanup` in the node namespace.
func (p *proxy) cleanup(t *testing.T) (string, error) {
	t.Helper()
	return p.c.Node.Exec(proxyBin, "--cleanup", "-v", "2")
}

// metricSum adds up every sample of a metric family on /metrics.
func metricSum(t *testing.T, p *proxy, name string) float64 {
	t.Helper()
	var sum float64
	for _, line := range strings.Split(p.get(t, "/metrics"), "\n") {
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
