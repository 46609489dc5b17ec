package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
)

// kube-proxy's /healthz is 503 with nodeEligible false while its Node does
// not exist (NodeEligible: no Node, false): a --hostname-override naming no
// Node, or a Node deleted, keeps load balancers off the node. The Node
// informer's first list holding no Node is that case; the Node appearing
// later makes it eligible.
func TestHealthzNodeMissingIsNotEligible(t *testing.T) {
	n, healthz := testNodeState()
	n.OnNodeSynced() // the informer listed no Node of this name
	if code, body := healthz(); code != http.StatusServiceUnavailable || !strings.Contains(body, `"nodeEligible":false`) {
		t.Errorf("no Node: /healthz %d %s, want 503 with nodeEligible false, as kube-proxy's", code, body)
	}
	n.OnNodeChange(config.NodeInfo{Name: "node-a"})
	if code, body := healthz(); code != http.StatusOK || !strings.Contains(body, `"nodeEligible":true`) {
		t.Errorf("Node added: /healthz %d %s, want 200", code, body)
	}
	n.OnNodeChange(config.NodeInfo{Name: "node-a", Deleted: true})
	if code, _ := healthz(); code != http.StatusServiceUnavailable {
		t.Errorf("Node deleted: /healthz %d, want 503", code)
	}
}

// A Node the informer listed before it synced stays eligible.
func TestHealthzNodePresentAtSyncIsEligible(t *testing.T) {
	n, healthz := testNodeState()
	n.OnNodeChange(config.NodeInfo{Name: "node-a", Zone: "z"})
	n.OnNodeSynced()
	if code, body := healthz(); code != http.StatusOK {
		t.Errorf("/healthz %d %s, want 200", code, body)
	}
}

// testNodeState is a nodeState over a synced health server, and a GET of
// its /healthz.
func testNodeState() (nodeState, func() (int, string)) {
	m := proxier.NewMetrics()
	p := proxier.New(proxier.Options{Metrics: m, Faults: faults.NewTable(0, 0, faults.NewMetrics(m.Registry))})
	h := healthcheck.NewProxierHealth(clock.RealClock{}, time.Minute)
	h.Updated()
	return nodeState{h, p, nil, new(atomic.Bool)}, func() (int, string) {
		rec := httptest.NewRecorder()
		h.Handler(false, nil).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
}
