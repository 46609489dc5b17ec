package demo

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
)

// The demo's Services, as the proxier names their ports ("ns/svc:port").
const (
	webServicePort    = "default/web:http"
	webManifest       = "web.yaml"
	stickyServicePort = "default/web-sticky:http"
	echoServicePort   = "default/echo:echo"
	stickyService     = "web-sticky-service.yaml"
	stickySlices      = "web-sticky-endpointslices.yaml"
)

// manifestDir writes the demo's Services and EndpointSlices into dir, the
// directory the proxier watches with --manifests. Each backend listens on
// its own port, and an EndpointSlice's ports apply to all its endpoints, so
// every backend gets a slice of its own, as pods with different ports would.
type manifestDir struct {
	dir      string
	backends []*backend.Server
}

// newManifestDir writes the demo's manifests for backends into a fresh
// temporary directory; the caller removes m.dir.
func newManifestDir(backends []*backend.Server) (*manifestDir, error) {
	dir, err := os.MkdirTemp("", "kube-userspace-proxy-demo-")
	if err != nil {
		return nil, err
	}
	m := &manifestDir{dir: dir, backends: backends}
	if err := m.writeAll(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return m, nil
}

func (m *manifestDir) writeAll() error {
	echo := service{name: "echo", clusterIP: "10.96.0.12", portName: "echo", port: 7, proto: "UDP"}.yaml() +
		slicesYAML("echo", "echo", "UDP", m.backends, udpPort)
	if err := m.setWebFaults(""); err != nil {
		return err
	}
	for _, f := range []struct{ name, text string }{
		{"echo.yaml", echo},
		{stickySlices, slicesYAML("web-sticky", "http", "TCP", m.backends, tcpPort)},
	} {
		if err := m.write(f.name, f.text); err != nil {
			return err
		}
	}
	return m.setStickyTimeout(0)
}

// setStickyTimeout rewrites web-sticky's Service; 0 leaves timeoutSeconds
// out, which means Kubernetes' default of 10800 s.
func (m *manifestDir) setStickyTimeout(seconds int) error {
	return m.write(stickyService, service{name: "web-sticky", clusterIP: "10.96.0.11", portName: "http", port: 80, proto: "TCP",
		affinity: "ClientIP", timeout: seconds}.yaml())
}

// setWebFaults rewrites web's manifest (its Service and EndpointSlices)
// with annotation as the Service's kube-userspace-proxy/faults annotation; ""
// leaves the annotation out: no faults.
func (m *manifestDir) setWebFaults(annotation string) error {
	web := service{name: "web", clusterIP: "10.96.0.10", portName: "http", port: 80, proto: "TCP", faults: annotation}.yaml() +
		slicesYAML("web", "http", "TCP", m.backends, tcpPort)
	return m.write(webManifest, web)
}

// setStickyBackends rewrites web-sticky's EndpointSlices to list only bs, as
// the EndpointSlice controller does when a pod goes away.
func (m *manifestDir) setStickyBackends(bs []*backend.Server) error {
	return m.write(stickySlices, slicesYAML("web-sticky", "http", "TCP", bs, tcpPort))
}

// write replaces name atomically: the watcher must never read half a file.
// The temporary name is hidden, and the manifest source skips hidden files.
func (m *manifestDir) write(name, text string) error {
	tmp := filepath.Join(m.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(m.dir, name))
}

// service is one Service manifest with a single port.
type service struct {
	name, clusterIP, portName string
	port                      int
	proto                     string // TCP or UDP
	affinity                  string // "" or ClientIP
	timeout                   int    // timeoutSeconds; 0 leaves it out
	faults                    string // the faults annotation (JSON); "" leaves it out
}

func (s service) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata:
  name: %s
  namespace: default
`, s.name)
	if s.faults != "" {
		// A single-quoted YAML scalar keeps the JSON readable as written;
		// a quote inside is doubled.
		fmt.Fprintf(&b, "  annotations:\n    %s: '%s'\n", faults.Annotation, strings.ReplaceAll(s.faults, "'", "''"))
	}
	fmt.Fprintf(&b, "spec:\n  clusterIP: %s\n", s.clusterIP)
	if s.affinity != "" {
		fmt.Fprintf(&b, "  sessionAffinity: %s\n", s.affinity)
	}
	if s.timeout > 0 {
		fmt.Fprintf(&b, "  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: %d\n", s.timeout)
	}
	// A named targetPort: every pod may listen on a different number, and
	// the EndpointSlices say which.
	fmt.Fprintf(&b, `  ports:
  - name: %s
    port: %d
    protocol: %s
    targetPort: %s
`, s.portName, s.port, s.proto, s.portName)
	return b.String()
}

func tcpPort(b *backend.Server) uint16 { return b.TCPAddr().Port() }
func udpPort(b *backend.Server) uint16 { return b.UDPAddr().Port() }

func slicesYAML(service, portName, proto string, bs []*backend.Server, port func(*backend.Server) uint16) string {
	var b strings.Builder
	for _, be := range bs {
		fmt.Fprintf(&b, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s-%s
  namespace: default
  labels:
    kubernetes.io/service-name: %s
addressType: IPv4
ports:
- name: %s
  port: %d
  protocol: %s
endpoints:
- addresses: ["%s"]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: default, name: %s}
`, service, be.Name, service, portName, port(be), proto, be.TCPAddr().Addr(), be.Name)
	}
	return b.String()
}
