package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

const localLBManifest = `apiVersion: v1
kind: Service
metadata: {name: local, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  externalTrafficPolicy: Local
  healthCheckNodePort: %s
  ports: [{name: http, port: 80, protocol: TCP}]
`

// TestHealthCheckNodePortOnNodePortAddresses: the whole binary's wiring
// (--manifests, --iptables=false, loopback only) opens a Service's
// healthCheckNodePort where NodePorts answer, each node address inside
// --nodeport-addresses (127.0.0.1 and ::1 here), not on --bind-address
// (127.0.0.2 here, the proxy sockets' address), as kube-proxy.
func TestHealthCheckNodePortOnNodePortAddresses(t *testing.T) {
	if ln, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		ln.Close()
	}
	port := freePortString(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "local.yaml"), []byte(fmt.Sprintf(localLBManifest, port)), 0o644); err != nil {
		t.Fatal(err)
	}
	o := loopbackOptions(dir, "127.0.0.2")
	o.nodePortAddresses = []string{"127.0.0.0/8", "::1/128"}
	o.nodePortRange = port // a manifest's healthCheckNodePort must be in the range
	runProxy(t, o)

	client := &http.Client{Timeout: time.Second}
	status := func(host string) (int, error) {
		resp, err := client.Get("http://" + net.JoinHostPort(host, port) + "/")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for _, host := range []string{"127.0.0.1", "::1"} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			code, err := status(host)
			if err == nil {
				// No endpoint on this node.
				if code != http.StatusServiceUnavailable {
					t.Errorf("healthCheckNodePort on %s answered %d, want 503", host, code)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("healthCheckNodePort %s not open on %s, a node address inside --nodeport-addresses: %v", port, host, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := status("127.0.0.2"); err == nil {
		t.Errorf("healthCheckNodePort %s open on the --bind-address 127.0.0.2, which is not a node address of the test (lo lists 127.0.0.1)", port)
	}
}
