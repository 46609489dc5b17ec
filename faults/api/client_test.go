package faultapi

import (
	"net/http/httptest"
	"strings"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// TestToxiproxyClient drives the API with Toxiproxy's own Go client
// (v2.5.0, the version go.mod pins), unchanged, over a real HTTP server.
func TestToxiproxyClient(t *testing.T) {
	table := faults.NewTable(0, 0, nil)
	table.Port("default.web.http", "TCP").SetAddresses("0.0.0.0:41234", "10.244.0.5:8080")
	declared := faults.Toxic{Name: "declared", Type: "latency", Toxicity: 1, Attributes: map[string]float64{"latency": 100}}
	if err := declared.Normalize(); err != nil {
		t.Fatal(err)
	}
	table.Port("default.web.http", "TCP").SetDeclared([]faults.Toxic{declared})
	srv := httptest.NewServer(New(table, "test"))
	defer srv.Close()
	client := toxiproxy.NewClient(srv.URL)

	// List and get.
	proxies, err := client.Proxies()
	if err != nil {
		t.Fatalf("Proxies: %v", err)
	}
	if p := proxies["default.web.http"]; len(proxies) != 1 || p == nil || p.Name != "default.web.http" ||
		p.Listen != "0.0.0.0:41234" || p.Upstream != "10.244.0.5:8080" || !p.Enabled || len(p.ActiveToxics) != 1 {
		t.Fatalf("Proxies = %+v", proxies)
	}
	proxy, err := client.Proxy("default.web.http")
	if err != nil {
		t.Fatalf("Proxy: %v", err)
	}
	if proxy.ActiveToxics[0].Name != "declared" || proxy.ActiveToxics[0].Attributes["latency"] != 100.0 {
		t.Fatalf("Proxy toxics = %+v", proxy.ActiveToxics)
	}
	if _, err := client.Proxy("default.nope.http"); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Errorf("Proxy(missing) = %v, want HTTP 404", err)
	}

	// Add, list, update, remove a toxic.
	added, err := proxy.AddToxic("slow", "latency", "downstream", 1, toxiproxy.Attributes{"latency": 300, "jitter": 10})
	if err != nil {
		t.Fatalf("AddToxic: %v", err)
	}
	if added.Name != "slow" || added.Type != "latency" || added.Stream != "downstream" || added.Toxicity != 1 ||
		added.Attributes["latency"] != 300.0 || added.Attributes["jitter"] != 10.0 {
		t.Errorf("AddToxic = %+v", added)
	}
	if _, err := proxy.AddToxic("slow", "latency", "", 1, nil); err == nil || !strings.Contains(err.Error(), "HTTP 409") {
		t.Errorf("AddToxic(again) = %v, want HTTP 409", err)
	}
	if _, err := proxy.AddToxic("bad", "nope", "", 1, nil); err == nil || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("AddToxic(bad type) = %v, want HTTP 400", err)
	}
	// The client's other entry point, by options.
	if _, err := client.AddToxic(&toxiproxy.ToxicOptions{ProxyName: "default.web.http", ToxicName: "cut",
		ToxicType: "reset_peer", Stream: "upstream", Toxicity: 0.25}); err != nil {
		t.Fatalf("client.AddToxic: %v", err)
	}
	toxics, err := proxy.Toxics()
	if err != nil {
		t.Fatalf("Toxics: %v", err)
	}
	// Upstream first, as Toxiproxy lists its chains.
	if names := toxicNames(toxics); names != "cut,declared,slow" {
		t.Errorf("Toxics = %s", names)
	}
	updated, err := proxy.UpdateToxic("slow", 0.5, toxiproxy.Attributes{"latency": 500})
	if err != nil {
		t.Fatalf("UpdateToxic: %v", err)
	}
	if updated.Toxicity != 0.5 || updated.Attributes["latency"] != 500.0 || updated.Attributes["jitter"] != 10.0 {
		t.Errorf("UpdateToxic = %+v", updated)
	}
	// -1 keeps the toxicity, as the client documents.
	if updated, err = proxy.UpdateToxic("slow", -1, toxiproxy.Attributes{"jitter": 0}); err != nil ||
		updated.Toxicity != 0.5 || updated.Attributes["jitter"] != 0.0 {
		t.Errorf("UpdateToxic(-1) = %+v, %v", updated, err)
	}
	if got, _ := table.Toxic("default.web.http", "slow"); got.Toxicity != 0.5 || got.Attributes["latency"] != 500 {
		t.Errorf("table has %+v", got)
	}
	if _, err := proxy.UpdateToxic("declared", 0.5, nil); err == nil || !strings.Contains(err.Error(), "HTTP 409") {
		t.Errorf("UpdateToxic(declared) = %v, want HTTP 409", err)
	}
	if err := proxy.RemoveToxic("slow"); err != nil {
		t.Fatalf("RemoveToxic: %v", err)
	}
	if err := proxy.RemoveToxic("slow"); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Errorf("RemoveToxic(again) = %v, want HTTP 404", err)
	}
	if err := proxy.RemoveToxic("declared"); err == nil || !strings.Contains(err.Error(), "HTTP 409") {
		t.Errorf("RemoveToxic(declared) = %v, want HTTP 409", err)
	}
	if toxics, err = proxy.Toxics(); err != nil || toxicNames(toxics) != "cut,declared" {
		t.Errorf("Toxics after remove = %s, %v", toxicNames(toxics), err)
	}

	// Down and up. The endpoints change in between, as when a pod
	// restarts: the client then sends a stale upstream, which must not
	// leave the proxy stuck down.
	if err := proxy.Disable(); err != nil {
		t.Fatalf("Disable: %v", err)
	}
	if info, _ := table.Proxy("default.web.http"); info.Enabled || proxy.Enabled {
		t.Errorf("after Disable: table enabled=%v, client enabled=%v", info.Enabled, proxy.Enabled)
	}
	table.Port("default.web.http", "TCP").SetAddresses("0.0.0.0:41234", "10.244.0.9:8080")
	if err := proxy.Enable(); err != nil {
		t.Fatalf("Enable: %v", err)
	}
	if info, _ := table.Proxy("default.web.http"); !info.Enabled || !proxy.Enabled || proxy.Upstream != "10.244.0.9:8080" {
		t.Errorf("after Enable: table enabled=%v, client proxy %+v", info.Enabled, proxy)
	}
	// Moving the proxy is refused.
	proxy.Listen = "127.0.0.1:1"
	if err := proxy.Save(); err == nil || !strings.Contains(err.Error(), "HTTP 409") {
		t.Errorf("Save(new listen) = %v, want HTTP 409", err)
	}

	// Populate accepts the proxies that exist, as a test suite's set-up
	// declares them, and leaves them up: the client sends "enabled":false
	// when the caller does not set it, and Toxiproxy leaves an existing
	// proxy as it is.
	populated, err := client.Populate([]toxiproxy.Proxy{{Name: "default.web.http", Upstream: "10.0.0.1:80"}})
	if err != nil || len(populated) != 1 || populated[0].Name != "default.web.http" || !populated[0].Enabled {
		t.Errorf("Populate(existing) = %+v, %v", populated, err)
	}
	if info, _ := table.Proxy("default.web.http"); !info.Enabled {
		t.Error("Populate turned the proxy down")
	}

	// Proxies are the cluster's Services: no create, populate or delete.
	if _, err := client.CreateProxy("mine", "127.0.0.1:0", "127.0.0.1:1"); err == nil ||
		!strings.Contains(err.Error(), "HTTP 409") || !strings.Contains(err.Error(), "Service") {
		t.Errorf("CreateProxy = %v, want HTTP 409 naming Services", err)
	}
	if _, err := client.Populate([]toxiproxy.Proxy{{Name: "mine", Listen: "127.0.0.1:0", Upstream: "127.0.0.1:1"}}); err == nil ||
		!strings.Contains(err.Error(), "HTTP 409") {
		t.Errorf("Populate = %v, want HTTP 409", err)
	}
	if err := proxy.Delete(); err == nil || !strings.Contains(err.Error(), "HTTP 409") {
		t.Errorf("Delete = %v, want HTTP 409", err)
	}

	// Reset removes API toxics and re-enables; declared toxics stay.
	if _, err := table.SetEnabled("default.web.http", false); err != nil {
		t.Fatal(err)
	}
	if err := client.ResetState(); err != nil {
		t.Fatalf("ResetState: %v", err)
	}
	proxy, err = client.Proxy("default.web.http")
	if err != nil {
		t.Fatalf("Proxy: %v", err)
	}
	if !proxy.Enabled || toxicNames(proxy.ActiveToxics) != "declared" {
		t.Errorf("after ResetState: enabled=%v toxics=%s", proxy.Enabled, toxicNames(proxy.ActiveToxics))
	}
}

func toxicNames(toxics toxiproxy.Toxics) string {
	names := make([]string, 0, len(toxics))
	for _, tx := range toxics {
		names = append(names, tx.Name)
	}
	return strings.Join(names, ",")
}

// Toxiproxy's noop toxic, as its suites add it with the client: accepted,
// named by Toxiproxy's default, listed and removed like any.
func TestToxiproxyClientNoop(t *testing.T) {
	table := newTestTable(t)
	srv := httptest.NewServer(New(table, "test"))
	defer srv.Close()
	proxy, err := toxiproxy.NewClient(srv.URL).Proxy(webName)
	if err != nil {
		t.Fatalf("Proxy: %v", err)
	}
	added, err := proxy.AddToxic("", "noop", "", 1, nil)
	if err != nil {
		t.Fatalf("AddToxic(noop): %v", err)
	}
	if added.Name != "noop_downstream" || added.Type != "noop" || added.Stream != "downstream" || len(added.Attributes) != 0 {
		t.Errorf("AddToxic(noop) = %+v, want Toxiproxy's noop_downstream", added)
	}
	if toxics, err := proxy.Toxics(); err != nil || toxicNames(toxics) != "declared,noop_downstream" {
		t.Errorf("Toxics = %s, %v", toxicNames(toxics), err)
	}
	if err := proxy.RemoveToxic("noop_downstream"); err != nil {
		t.Errorf("RemoveToxic(noop): %v", err)
	}
}

// The client sends a nil attribute as JSON null; Toxiproxy's update then
// leaves it as it is (its decode into the toxic's struct skips null).
func TestToxiproxyClientNullAttributeKept(t *testing.T) {
	table := newTestTable(t)
	addAPIToxic(t, table) // slow: latency 300, jitter 10
	srv := httptest.NewServer(New(table, "test"))
	defer srv.Close()
	proxy, err := toxiproxy.NewClient(srv.URL).Proxy(webName)
	if err != nil {
		t.Fatalf("Proxy: %v", err)
	}
	updated, err := proxy.UpdateToxic("slow", -1, toxiproxy.Attributes{"jitter": nil, "latency": 500})
	if err != nil {
		t.Fatalf("UpdateToxic: %v", err)
	}
	if updated.Attributes["latency"] != 500.0 || updated.Attributes["jitter"] != 10.0 {
		t.Errorf("UpdateToxic(jitter null) = %v, want latency 500 and jitter kept at 10", updated.Attributes)
	}
}

// A proxy's listen moves when its Service's port or ClusterIP is changed in
// place; the client sends the whole proxy back with Enable and Disable, so
// a suite that fetched it before then sends the old listen. That copy is
// taken (the reply shows the new listen), as a stale upstream is: refused,
// the proxy stayed down. A listen the port never had is still refused, in
// POST and in /populate.
func TestToxiproxyClientStaleListen(t *testing.T) {
	table := newTestTable(t)
	srv := httptest.NewServer(New(table, "test"))
	defer srv.Close()
	client := toxiproxy.NewClient(srv.URL)
	proxy, err := client.Proxy(webName)
	if err != nil {
		t.Fatalf("Proxy: %v", err)
	}
	old := proxy.Listen
	const moved = "10.96.0.10:8080"
	table.Port(webName, "TCP").SetAddresses(moved, webUpstream)
	if err := proxy.Disable(); err != nil {
		t.Fatalf("Disable with the listen fetched before it moved (%s, now %s): %v", old, moved, err)
	}
	if proxy.Listen != moved || proxy.Enabled {
		t.Errorf("Disable answered listen %s, enabled %v; want %s, false", proxy.Listen, proxy.Enabled, moved)
	}
	proxy.Listen = old
	if err := proxy.Enable(); err != nil {
		t.Fatalf("Enable with the old listen: %v", err)
	}
	if _, err := client.Populate([]toxiproxy.Proxy{{Name: webName, Listen: old, Upstream: webUpstream}}); err != nil {
		t.Errorf("Populate with the old listen: %v", err)
	}
	proxy.Listen = "127.0.0.1:1"
	if err := proxy.Disable(); err == nil || !strings.Contains(err.Error(), "HTTP 409") {
		t.Errorf("Disable with a listen the port never had = %v, want HTTP 409", err)
	}
	if _, err := client.Populate([]toxiproxy.Proxy{{Name: webName, Listen: "127.0.0.1:1", Upstream: webUpstream}}); err == nil ||
		!strings.Contains(err.Error(), "HTTP 409") {
		t.Errorf("Populate with a listen the port never had = %v, want HTTP 409", err)
	}
	if info, _ := table.Proxy(webName); !info.Enabled {
		t.Error("a refused listen turned the proxy down")
	}
}
