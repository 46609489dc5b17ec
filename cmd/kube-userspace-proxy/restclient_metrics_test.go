package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The API client's requests show on /metrics under kube-proxy's names:
// there were no rest_client_* series at all (metrics/config audit).
func TestRESTClientMetrics(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"ServiceList","apiVersion":"v1","metadata":{},"items":[]}`))
	}))
	defer api.Close()
	// client-go takes its metric hooks once per process, maybe already
	// from another test's run(): a registry registered later must still
	// get them. This server's own host tells its samples from others'.
	reg := prometheus.NewRegistry()
	registerRESTClientMetrics(reg)
	host := strings.TrimPrefix(api.URL, "http://")
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Services("").List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "rest_client_requests_total":
				found[mf.GetName()] = found[mf.GetName()] || labels["host"] == host && labels["code"] == "200" && labels["method"] == "GET" && m.GetCounter().GetValue() >= 1
			case "rest_client_request_duration_seconds":
				found[mf.GetName()] = found[mf.GetName()] || labels["host"] == host && labels["verb"] == "GET" && m.GetHistogram().GetSampleCount() >= 1
			}
		}
	}
	for _, name := range []string{"rest_client_requests_total", "rest_client_request_duration_seconds"} {
		if !found[name] {
			t.Errorf("no %s sample for the GET", name)
		}
	}
}
