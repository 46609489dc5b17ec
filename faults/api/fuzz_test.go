package faultapi

import (
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// FuzzRequest: no request body panics the fault API or gets a 5xx; every
// refusal is a 4xx in Toxiproxy's error shape ({"error": non-empty,
// "status": the code}); a toxic the API accepts passes its own checks and
// reads back as it was answered.
func FuzzRequest(f *testing.F) {
	for _, seed := range []struct {
		route uint8
		toxic string
		body  string
	}{
		{0, "", `{"name":"slow","type":"latency","stream":"upstream","toxicity":0.5,"attributes":{"latency":300,"jitter":10}}`},
		{0, "", `{"name":"cut","type":"down","clients":["10.0.0.0/8"],"seed":7}`},
		{0, "", `{"type":"slicer","attributes":{"average_size":0}}`},
		{0, "", `{"type":"latency","toxicity":1e40}`},
		{0, "", `{"type":"latency","port":"http"}`},
		{0, "", `name=slow&type=latency`},
		{1, "slow", `{"toxicity":0.1,"attributes":{"latency":null,"Jitter":5}}`},
		{1, "declared", `{"toxicity":0.5}`},
		{1, "slow", `null`},
		{2, "", `{"enabled":false}`},
		{2, "", `{"enabled":"no"}`},
		{3, "", `[{"name":"default.web.http","upstream":"x"}]`},
		{4, "", `{"name":"l","type":"loss","attributes":{"p":0.1,"r":0.5}}`},
		{5, "l", `{"attributes":{"rate":0.2}}`},
		{6, "slow", ``},
		{7, "", ``},
	} {
		f.Add(seed.route, seed.toxic, seed.body)
	}
	f.Fuzz(func(t *testing.T, route uint8, toxic, body string) {
		table := newTestTable(t)
		addAPIToxic(t, table)
		h := New(table, "test")
		toxicPath := url.PathEscape(toxic)
		var method, path string
		switch route % 8 {
		case 0:
			method, path = "POST", "/proxies/"+webName+"/toxics"
		case 1:
			method, path = "POST", "/proxies/"+webName+"/toxics/"+toxicPath
		case 2:
			method, path = "POST", "/proxies/"+webName
		case 3:
			method, path = "POST", "/populate"
		case 4:
			method, path = "POST", "/proxies/"+dnsName+"/toxics"
		case 5:
			method, path = "PATCH", "/proxies/"+dnsName+"/toxics/"+toxicPath
		case 6:
			method, path = "DELETE", "/proxies/"+webName+"/toxics/"+toxicPath
		case 7:
			method, path = "POST", "/reset"
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, "http://fault-api"+path, strings.NewReader(body)))
		switch {
		case rec.Code == 204:
			return
		case rec.Code >= 500:
			t.Fatalf("%s %s %q: %d %s", method, path, body, rec.Code, rec.Body)
		case rec.Code >= 300 && rec.Code < 400:
			// The mux's redirect of a path it cleans (a toxic named "."
			// or ".."): nothing was accepted.
			return
		case rec.Code >= 400:
			var e struct {
				Error  string
				Status int
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == "" || e.Status != rec.Code {
				t.Fatalf("%s %s %q: %d with a body not in Toxiproxy's error shape: %s", method, path, body, rec.Code, rec.Body)
			}
			return
		}
		if route%8 != 0 && route%8 != 1 && route%8 != 4 && route%8 != 5 {
			return
		}
		// An accepted toxic: it passes its own checks, and the proxy shows it
		// as the answer did.
		var answered faults.Toxic
		if err := json.Unmarshal(rec.Body.Bytes(), &answered); err != nil {
			t.Fatalf("answer does not read back as a toxic: %v: %s", err, rec.Body)
		}
		again := answered
		if err := again.Normalize(); err != nil {
			t.Fatalf("accepted toxic fails its own checks: %v: %s", err, rec.Body)
		}
		proxy := webName
		if route%8 >= 4 {
			proxy = dnsName
		}
		shown, err := table.Toxic(proxy, answered.Name)
		if err != nil {
			t.Fatalf("accepted toxic %q not shown: %v", answered.Name, err)
		}
		a, _ := json.Marshal(answered)
		s, _ := json.Marshal(shown.Toxic)
		if string(a) != string(s) {
			t.Fatalf("answered %s, shown %s", a, s)
		}
	})
}
