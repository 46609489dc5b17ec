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

const dualLocalManifest = `apiVersion: v1
kind: Service
metadata: {name: dual, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.21
  clusterIPs: [10.96.0.21, "fd00::21"]
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  externalTrafficPolicy: Local
  healthCheckNodePort: %s
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-v4, namespace: default, labels: {kubernetes.io/service-name: dual}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.1.0.1]
  nodeName: elsewhere
  conditions: {ready: true}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-v6, namespace: default, labels: {kubernetes.io/service-name: dual}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: ["fd01::1"]
  nodeName: n1
  conditions: {ready: true}
`

// A dual-stack Service's healthCheckNodePort answers each family with
// that family's local endpoints, as kube-proxy's per-family proxiers'
// health servers (each on its family's --nodeport-addresses) do: a node
// whose only local pod of the Service is IPv6 fails the check a load
// balancer makes on its IPv4 address, since its IPv4 NodePort and LB IP
// reset every client (externalTrafficPolicy Local, no local IPv4
// endpoint). One count for both families said 200 there.
func TestHealthCheckNodePortPerFamily(t *testing.T) {
	if ln, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		ln.Close()
	}
	port := freePortString(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dual.yaml"), []byte(fmt.Sprintf(dualLocalManifest, port)), 0o644); err != nil {
		t.Fatal(err)
	}
	o := loopbackOptions(dir, "127.0.0.1")
	o.hostnameOverride = "n1"
	o.nodePortRange = port
	runProxy(t, o)

	client := &http.Client{Timeout: time.Second}
	for _, tc := range []struct {
		host string
		want int
	}{{"127.0.0.1", http.StatusServiceUnavailable}, {"::1", http.StatusOK}} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := client.Get("http://" + net.JoinHostPort(tc.host, port) + "/")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != tc.want {
					t.Errorf("healthCheckNodePort on %s answered %d (weight %s), want %d", tc.host, resp.StatusCode, resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), tc.want)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("healthCheckNodePort %s not open on %s: %v", port, tc.host, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
