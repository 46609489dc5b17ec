package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// TestStateFileGraceCountsFromStart: a proxy started while its API server
// hangs (it accepts connections and never answers: a stopped process, an
// overloaded one) serves the --state-file within the grace of its start.
// The grace began only after the 2 s read of the Node, so the node's
// Services were refused for the read and the grace together (4.1 s with
// the default grace, against a real kube-apiserver stopped with SIGSTOP).
func TestStateFileGraceCountsFromStart(t *testing.T) {
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hung.Close() })
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // never answered, closed when the test ends
			mu.Unlock()
		}
	}()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	cfg := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://%s\", insecure-skip-tls-verify: true}}]\n"+
		"users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", hung.Addr())
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state.json")
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kept"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.7.7", ClusterIPs: []string{"10.96.7.7"},
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}}},
	}
	if err := config.WriteStateFile(state, config.State{Written: time.Now(), Services: []*v1.Service{svc}}); err != nil {
		t.Fatal(err)
	}

	o := newOptions()
	o.kubeconfig = kubeconfig
	o.stateFile = state
	o.iptables = false
	o.bindAddress = "127.0.0.1"
	o.hostnameOverride = "n1"
	o.healthzBindAddress = "127.0.0.1:0"
	o.metricsBindAddress = "127.0.0.1:0"
	v, err := o.validate()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	metrics := make(chan string, 1)
	began := time.Now()
	go func() { done <- run(ctx, o, v, func(_ *proxier.Proxier, addr string) { metrics <- addr }) }()
	t.Cleanup(func() {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	var addr string
	select {
	case addr = <-metrics:
	case err := <-done:
		t.Fatalf("run returned before starting: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not started within 20 s")
	}
	for {
		if resp, err := http.Get("http://" + addr + "/debug/services"); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), "default/kept:http") {
				break
			}
		}
		if time.Since(began) > 10*time.Second {
			t.Fatal("the state file's Service not served within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Timers never fire early, so a grace counted from after the Node's
	// read comes at its end or later: any time before it is the grace
	// counted from the start, however late a loaded machine ran it (a
	// bound of the grace plus 1 s was missed by 10 ms at load 18).
	if took, late := time.Since(began), config.DefaultStateFileGrace+nodeLookupTimeout; took >= late {
		t.Errorf("the state file served %v after the start, want within the %v grace (before %v: the grace counted after the Node's read)", took.Round(10*time.Millisecond), config.DefaultStateFileGrace, late)
	}
}
