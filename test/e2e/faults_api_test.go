package e2e

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

// faultAPIAddr is where TestFaults' proxy serves the fault API (Toxiproxy's
// port), on the node namespace's loopback.
const faultAPIAddr = "127.0.0.1:8474"

// checkFaultsAPIDown sets a Service port down through the fault API (Toxiproxy's
// POST /proxies/{p} {"enabled":false}) while a pod asks through the ClusterIP: its
// connects are refused (ECONNREFUSED: the RST of a port nothing listens on, through
// the portal's DNAT), as at Toxiproxy's disabled proxy, and {"enabled":true} serves
// again on the same proxy port, without a rule change.
func checkFaultsAPIDown(t *testing.T, e *env) {
	s := e.svcs["downed"]
	cl := e.pod1(ipFaultAPI)
	proxy := testNamespace + "." + s.name + ".http"
	before := proxyAddressOf(t, e, s.portName("http"))
	setEnabled := func(enabled string) {
		t.Helper()
		resp, err := e.c.Node.HTTPClient(2*time.Second).Post("http://"+faultAPIAddr+"/proxies/"+proxy,
			"application/json", strings.NewReader(`{"enabled":`+enabled+`}`))
		if err != nil {
			t.Fatalf("POST /proxies/%s enabled %s: %v", proxy, enabled, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /proxies/%s enabled %s: %d %s", proxy, enabled, resp.StatusCode, body)
		}
	}
	refused := func(_ string, err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

	setEnabled("false")
	took := cl.WaitFor(t, "tcp", s.tcp(), time.Now(), faultPatience, "refused (ECONNREFUSED) with the proxy disabled", refused)
	for i := range faultSamples {
		if name, err := cl.Ask("tcp", s.tcp(), harness.AnswerTimeout); !refused(name, err) {
			t.Errorf("tcp %s, request %d with the proxy disabled: %q, %v; want ECONNREFUSED", s.tcp(), i+1, name, err)
		}
	}
	setEnabled("true")
	back := cl.WaitFor(t, "tcp", s.tcp(), time.Now(), faultPatience, "answered by b1 once enabled", answeredBy("b1"))
	timedAsks(t, cl, "tcp", s.tcp(), faultSamples)
	if after := proxyAddressOf(t, e, s.portName("http")); after != before {
		t.Errorf("the proxy address of %s moved from %s to %s across the down and up", s.portName("http"), before, after)
	}
	// The listen the API shows is where a Toxiproxy test dials the proxy:
	// from the node and from a pod it answers (it was the proxy socket,
	// whose connections the port guard drops).
	listen := faultListenOf(t, e, proxy)
	for _, from := range []harness.Client{e.node(), cl} {
		if name, err := from.Ask("tcp", listen, harness.AnswerTimeout); err != nil || name != "b1" {
			t.Errorf("tcp to the fault API's listen %s from %s: %q, %v; want b1's answer", listen, from, name, err)
		}
	}
	figure(t, "fault API enabled:false: connects refused (ECONNREFUSED) %d ms after the call; enabled:true: answered again %d ms after",
		took.Milliseconds(), back.Milliseconds())
}

// proxyAddressOf is a service port's proxy socket address on /debug/services.
func proxyAddressOf(t *testing.T, e *env, servicePort string) string {
	t.Helper()
	var rows []struct {
		ServicePort  string `json:"servicePort"`
		ProxyAddress string `json:"proxyAddress"`
	}
	body := e.p.Get(t, "/debug/services")
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Fatalf("/debug/services: %v\n%s", err, body)
	}
	for _, r := range rows {
		if r.ServicePort == servicePort {
			return r.ProxyAddress
		}
	}
	t.Fatalf("/debug/services has no %s:\n%s", servicePort, body)
	return ""
}

// faultListenOf is the listen address the fault API shows for proxy.
func faultListenOf(t *testing.T, e *env, proxy string) netip.AddrPort {
	t.Helper()
	resp, err := e.c.Node.HTTPClient(2 * time.Second).Get("http://" + faultAPIAddr + "/proxies/" + proxy)
	if err != nil {
		t.Fatalf("GET /proxies/%s: %v", proxy, err)
	}
	defer resp.Body.Close()
	var p struct {
		Listen string `json:"listen"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatalf("GET /proxies/%s: %v", proxy, err)
	}
	listen, err := netip.ParseAddrPort(p.Listen)
	if err != nil {
		t.Fatalf("GET /proxies/%s: listen %q: %v", proxy, p.Listen, err)
	}
	return listen
}
