package faultapi

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// BenchmarkToxicAddAt2000: one API toxic added and removed on a proxy that
// holds 2,000 (a suite adding toxics by the thousand); each add's cost grows
// with the toxics the port holds.
func BenchmarkToxicAddAt2000(b *testing.B) {
	table := faults.NewTable(0, 0, nil)
	table.Port(webName, "TCP").SetAddresses(webListen, webUpstream)
	for i := range 2000 {
		if _, err := table.AddToxic(webName, faults.Toxic{Name: fmt.Sprintf("t%d", i), Type: "latency", Toxicity: 0.5}); err != nil {
			b.Fatal(err)
		}
	}
	h := New(table, "test")
	const body = `{"name":"b","type":"latency","toxicity":0.5,"attributes":{"latency":10}}`
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/proxies/"+webName+"/toxics", strings.NewReader(body)))
		if rec.Code != 200 {
			b.Fatal(rec.Code, rec.Body)
		}
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("DELETE", "/proxies/"+webName+"/toxics/b", nil))
		if rec.Code != 204 {
			b.Fatal(rec.Code, rec.Body)
		}
	}
}
