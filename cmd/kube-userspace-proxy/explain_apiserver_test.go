package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/lockedbuf"
)

// explainCommand starts this test binary as `kube-userspace-proxy explain
// args...`, its stdout and stderr in the buffers.
// stderr may be read while it runs.
func explainCommand(t *testing.T, args ...string) (cmd *exec.Cmd, stdout *bytes.Buffer, stderr *lockedbuf.Buffer) {
	t.Helper()
	cmd = exec.Command(os.Args[0], append([]string{"-test.run=^$", "--", "explain"}, args...)...)
	cmd.Env = append(os.Environ(), runAsCommand+"=1")
	stdout, stderr = new(bytes.Buffer), new(lockedbuf.Buffer)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, stdout, stderr
}

// waitExit waits at most limit for cmd and returns its exit status.
func waitExit(t *testing.T, cmd *exec.Cmd, limit time.Duration, stderr fmt.Stringer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("explain still running after %s:\n%s", limit, stderr)
		return -1
	}
}

// An API server that does not answer: explain says at once what it waits
// for, and gives up after --timeout with the last dial error (it said
// nothing for 30 s, then retried forever).
func TestExplainUnreachableAPIServerGivesUp(t *testing.T) {
	cmd, stdout, stderr := explainCommand(t, "--master", "http://127.0.0.1:1", "--timeout", "2s")
	if code := waitExit(t, cmd, 20*time.Second, stderr); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	got := stderr.String()
	for _, want := range []string{
		"waiting for the API server at http://127.0.0.1:1 for up to 2s (--timeout)\n",
		"the API server at http://127.0.0.1:1 did not answer within 2s (--timeout); last error: ",
		"connection refused",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("stderr lacks %q:\n%s", want, got)
		}
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout:\n%s", stdout)
	}
}

// An API server that refuses the reads (401, 403) answered: explain says it
// refused them, not that it "did not answer" (review: an expired client
// certificate read as an outage).
func TestExplainRefusedReadsSaidAsRefused(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}`))
	}))
	defer api.Close()
	cmd, _, stderr := explainCommand(t, "--master", api.URL, "--timeout", "2s")
	if code := waitExit(t, cmd, 20*time.Second, stderr); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	got := stderr.String()
	want := "the API server at " + api.URL + " refused the reads for 2s (--timeout): Unauthorized\n"
	if !strings.Contains(got, want) || strings.Contains(got, "did not answer") {
		t.Errorf("stderr lacks %q (or says it did not answer):\n%s", want, got)
	}
}

// --master HOST:PORT without a scheme is plain HTTP (client-go's reading);
// an HTTPS API server answers it with 400, which explain reported as
// "did not answer within 2s; last error: the server rejected our request
// for an unknown reason". It answered: explain says what to write.
func TestExplainPlainHTTPToHTTPSSaidSo(t *testing.T) {
	api := httptest.NewTLSServer(http.NotFoundHandler())
	defer api.Close()
	hostPort := api.Listener.Addr().String()
	cmd, _, stderr := explainCommand(t, "--master", hostPort, "--timeout", "2s")
	if code := waitExit(t, cmd, 20*time.Second, stderr); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	got := stderr.String()
	want := "the API server at " + hostPort + " speaks HTTPS and was sent plain HTTP for 2s (--timeout): write --master https://" + hostPort
	if !strings.Contains(got, want) || strings.Contains(got, "did not answer") {
		t.Errorf("stderr lacks %q (or says it did not answer):\n%s", want, got)
	}
}

// Ctrl-C while waiting for the API server: "interrupted" and a non-zero
// exit, without client-go's "Unable to sync caches" (UnhandledError) line
// or "context canceled".
func TestExplainInterruptedWhileWaiting(t *testing.T) {
	cmd, _, stderr := explainCommand(t, "--master", "http://127.0.0.1:1")
	// Once it says what it waits for, its signal handler is in place: a
	// second's sleep instead was too short for a race-built child on a
	// loaded machine, which SIGINT then killed (exit -1).
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(stderr.String(), "waiting for the API server at"); {
		if time.Now().After(deadline) {
			t.Fatalf("explain never said it waits for the API server:\n%s", stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second, stderr); code != 130 { // 128 + SIGINT
		t.Errorf("exit %d, want 130", code)
	}
	got := stderr.String()
	if !strings.Contains(got, "kube-userspace-proxy explain: interrupted") {
		t.Errorf("stderr does not say it was interrupted:\n%s", got)
	}
	for _, bad := range []string{"UnhandledError", "Unable to sync caches", "context canceled"} {
		if strings.Contains(got, bad) {
			t.Errorf("stderr holds %q:\n%s", bad, got)
		}
	}
}

// fakeAPIServer answers explain's reads as an API server holding objects:
// each list path's JSON list, this node's Node at its path, /readyz. A
// watch-list request (sendInitialEvents) is refused as a server without
// it refuses it, so the informers list; a plain watch then waits for the
// client to go.
func fakeAPIServer(t *testing.T, lists, objects map[string]string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		q := r.URL.Query()
		switch {
		case r.URL.Path == "/readyz":
			_, _ = w.Write([]byte("ok"))
		case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"BadRequest","code":400}`))
		case q.Get("watch") == "true":
			<-r.Context().Done()
		case lists[r.URL.Path] != "":
			_, _ = w.Write([]byte(lists[r.URL.Path]))
		case objects[r.URL.Path] != "":
			_, _ = w.Write([]byte(objects[r.URL.Path]))
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// explain against an API server applies the zone hints of the node it
// explains, as the proxy on that node does: the zone is its Node's
// topology.kubernetes.io/zone label. It listed the endpoints of every
// zone, where the proxy serves only its own zone's.
func TestExplainAPIServerZoneHints(t *testing.T) {
	srv := fakeAPIServer(t, map[string]string{
		"/api/v1/services": `{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[
			{"metadata":{"namespace":"default","name":"web","resourceVersion":"1"},
			 "spec":{"type":"ClusterIP","clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10"],"ipFamilies":["IPv4"],
			  "trafficDistribution":"PreferSameZone","ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}]}}]}`,
		"/apis/discovery.k8s.io/v1/endpointslices": `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[
			{"metadata":{"namespace":"default","name":"web-1","resourceVersion":"1","labels":{"kubernetes.io/service-name":"web"}},
			 "addressType":"IPv4","ports":[{"name":"http","protocol":"TCP","port":8080}],
			 "endpoints":[
			  {"addresses":["10.1.1.1"],"conditions":{"ready":true},"zone":"zone-a","hints":{"forZones":[{"name":"zone-a"}]}},
			  {"addresses":["10.1.2.1"],"conditions":{"ready":true},"zone":"zone-b","hints":{"forZones":[{"name":"zone-b"}]}}]}]}`,
	}, map[string]string{
		"/api/v1/nodes/node-a": `{"kind":"Node","apiVersion":"v1","metadata":{"name":"node-a","labels":{"topology.kubernetes.io/zone":"zone-a"}},
			"status":{"addresses":[{"type":"InternalIP","address":"192.168.50.10"}]}}`,
	})
	for _, tt := range []struct {
		node, want, zone string
	}{
		{"node-a", "endpoints:        10.1.1.1:8080\n", "Endpoints follow topology hints for zone zone-a, the topology.kubernetes.io/zone of Node node-a.\n"},
		// No Node (or no zone): hints are not used, as by the proxy.
		{"node-b", "endpoints:        10.1.1.1:8080, 10.1.2.1:8080\n", ""},
	} {
		var out bytes.Buffer
		code := explain(t.Context(), []string{"--master", srv.URL, "--hostname-override", tt.node, "--node-ip", "192.168.50.10",
			"--timeout", "10s"}, &out)
		if code != 0 {
			t.Fatalf("node %s: exit %d\n%s", tt.node, code, &out)
		}
		if !strings.Contains(out.String(), tt.want) {
			t.Errorf("node %s: explain does not show %q:\n%s", tt.node, tt.want, &out)
		}
		if said := strings.Contains(out.String(), "topology hints for zone"); said != (tt.zone != "") || !strings.Contains(out.String(), tt.zone) {
			t.Errorf("node %s: the header should say %q:\n%s", tt.node, tt.zone, &out)
		}
	}
}

// explain against an API server says when a Service's faults annotation is
// invalid (the API server stores any): "faults: none" read as a Service
// declaring none, where the proxy logs the error and keeps the last valid
// toxics (a new Service gets none).
func TestExplainAPIServerInvalidFaults(t *testing.T) {
	srv := fakeAPIServer(t, map[string]string{
		"/api/v1/services": `{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[
			{"metadata":{"namespace":"default","name":"web","resourceVersion":"1",
			  "annotations":{"kube-userspace-proxy/faults":"[{\"name\":\"slow\",\"type\":\"latncy\"}]"}},
			 "spec":{"type":"ClusterIP","clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10"],"ipFamilies":["IPv4"],
			  "ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}]}}]}`,
		"/apis/discovery.k8s.io/v1/endpointslices": `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[]}`,
	}, nil)
	var out bytes.Buffer
	if code := explain(t.Context(), []string{"--master", srv.URL, "--node-ip", "192.168.50.10", "--timeout", "10s"}, &out); code != 0 {
		t.Fatalf("exit %d\n%s", code, &out)
	}
	want := `faults:           none: the annotation is invalid (metadata.annotations[kube-userspace-proxy/faults]: [0].type: unknown toxic type "latncy"`
	if !strings.Contains(out.String(), want) {
		t.Errorf("explain does not show %q:\n%s", want, &out)
	}
}

// explain against an API server names the headless and ExternalName
// Services with why they are not proxied, as it does from manifests
// (TestExplainNamesTheServicesItDoesNotProxy): the informers left them out
// before the plan saw them, so they were not mentioned at all.
func TestExplainAPIServerNamesTheServicesItDoesNotProxy(t *testing.T) {
	srv := fakeAPIServer(t, map[string]string{
		"/api/v1/services": `{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[
			{"metadata":{"namespace":"default","name":"db","resourceVersion":"1"},
			 "spec":{"type":"ClusterIP","clusterIP":"None","clusterIPs":["None"],"ipFamilies":["IPv4"],
			  "ports":[{"protocol":"TCP","port":5432,"targetPort":5432}]}},
			{"metadata":{"namespace":"default","name":"search","resourceVersion":"1"},
			 "spec":{"type":"ExternalName","externalName":"search.example.com"}}]}`,
		"/apis/discovery.k8s.io/v1/endpointslices": `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[]}`,
	}, nil)
	var out bytes.Buffer
	if code := explain(t.Context(), []string{"--master", srv.URL, "--node-ip", "192.168.50.10", "--timeout", "10s"}, &out); code != 0 {
		t.Fatalf("exit %d\n%s", code, &out)
	}
	outputHas(t, out.String(),
		"== default/db (no service port to proxy) ==\nwarnings:         not proxied: a headless Service (clusterIP None) has no service address;",
		"== default/search (no service port to proxy) ==\nwarnings:         not proxied: type ExternalName is a name in cluster DNS only, an alias (CNAME) of search.example.com;",
	)
}
