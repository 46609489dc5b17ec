package proxier

import (
	"encoding/json"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

func annotated(value string) svcOpt {
	return func(s *v1.Service) { s.Annotations = map[string]string{"kube-userspace-proxy/faults": value} }
}

func declaredToxics(t *testing.T, p *Proxier, proxy string) []string {
	t.Helper()
	info, err := p.opts.Faults.Proxy(proxy)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tx := range info.Toxics {
		names = append(names, tx.Name+"/"+tx.Origin)
	}
	return names
}

// A changed faults annotation reaches an open port at once, without a
// sync (toxics are not rules: they need not wait for min-sync-period); an
// invalid one leaves the last valid toxics in force, through syncs too.
func TestFaultAnnotationAppliesWithoutSync(t *testing.T) {
	p := newTestProxier(t, Options{})
	p.OnServiceAdd(makeService("web"))
	p.Sync()
	const proxy = "default.web.p"
	if got := declaredToxics(t, p, proxy); len(got) != 0 {
		t.Fatalf("toxics before any annotation: %v", got)
	}

	steps := []struct {
		annotation string // "" = none
		want       []string
	}{
		{`[{"name":"slow","type":"latency","attributes":{"latency":300}}]`, []string{"slow/annotation"}},
		{`[{"name":"cut","type":"reset_peer"}]`, []string{"cut/annotation"}},
		{`[{"name":"bad","type":"explode"}]`, []string{"cut/annotation"}},
		{"", nil},
	}
	for _, step := range steps {
		svc := makeService("web")
		if step.annotation != "" {
			svc = makeService("web", annotated(step.annotation))
		}
		p.OnServiceUpdate(nil, svc)
		got := declaredToxics(t, p, proxy)
		if len(got) != len(step.want) || (len(got) > 0 && got[0] != step.want[0]) {
			t.Fatalf("annotation %q: toxics %v before any sync, want %v", step.annotation, got, step.want)
		}
		p.Sync()
		if after := declaredToxics(t, p, proxy); len(after) != len(got) || (len(got) > 0 && after[0] != got[0]) {
			t.Fatalf("annotation %q: a sync changed toxics %v to %v", step.annotation, got, after)
		}
	}
}

// A faults annotation changed while a sync runs (here: while it opens the
// Service's port) keeps the toxics applyFaultsNow gave the port: the sync
// parsed the Service before the change, and applied its older toxics over
// them until the next sync. An invalid change leaves the last valid
// toxics, and a change of something else the Service's own.
func TestFaultAnnotationChangedDuringSyncStays(t *testing.T) {
	const a = `[{"name":"a","type":"latency","attributes":{"latency":100}}]`
	for _, tc := range []struct {
		name   string
		during svcOpt // the Service as updated during the sync
		want   []string
	}{
		{"annotation changed", annotated(`[{"name":"b","type":"latency","attributes":{"latency":200}}]`), []string{"b/annotation"}},
		{"annotation made invalid", annotated(`[{"name":"bad","type":"explode"}]`), []string{"a/annotation"}},
		{"another change", func(s *v1.Service) { annotated(a)(s); s.Labels = map[string]string{"tier": "web"} }, []string{"a/annotation"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestProxier(t, Options{})
			before, during := makeService("web", annotated(a)), makeService("web", tc.during)
			p.OnServiceAdd(before)
			listen := p.listen
			p.listen = func(name loadbalancer.ServicePortName, bind netip.Addr, port int, needIPv6 bool, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) (proxySocket, error) {
				p.listen = listen
				p.OnServiceUpdate(before, during) // the informer delivers it now
				return listen(name, bind, port, needIPv6, sp, fp, cfg)
			}
			p.Sync()
			if got := declaredToxics(t, p, "default.web.p"); !slices.Equal(got, tc.want) {
				t.Errorf("toxics after the sync: %v, want %v", got, tc.want)
			}
		})
	}
}

// An unnamed port's name in the fault API carries its number
// ("default.web.80"): when the number changes the port is known by the new
// name, with the Service's toxics, and the old name leaves the table (it
// stayed there for good, and the API answered the new name with 404).
func TestUnnamedPortNumberChangeRenamesFaultPort(t *testing.T) {
	p := newTestProxier(t, Options{})
	unnamed := func(port int32) svcOpt {
		return func(s *v1.Service) { s.Spec.Ports[0].Name, s.Spec.Ports[0].Port = "", port }
	}
	proxies := func() []string {
		var names []string
		for _, fp := range p.opts.Faults.Proxies() {
			names = append(names, fp.Name)
		}
		return names
	}
	old := makeService("web", unnamed(80))
	p.OnServiceAdd(old)
	p.Sync()
	svc := makeService("web", unnamed(81), annotated(`[{"name":"slow","type":"latency","attributes":{"latency":300}}]`))
	p.OnServiceUpdate(old, svc)
	p.Sync()
	if got := proxies(); len(got) != 1 || got[0] != "default.web.81" {
		t.Fatalf("fault ports after 80 -> 81: %v, want [default.web.81]", got)
	}
	if got := declaredToxics(t, p, "default.web.81"); len(got) != 1 || got[0] != "slow/annotation" {
		t.Fatalf("toxics of default.web.81: %v, want [slow/annotation]", got)
	}
	p.OnServiceDelete(svc)
	p.Sync()
	if got := proxies(); len(got) != 0 {
		t.Fatalf("fault ports after the Service is gone: %v", got)
	}
}

// The renamed fault port keeps the service port's fault series: it opens
// before the old name is removed, under the same service_port label, and
// that removal forgot the label's series while the latency went on acting.
func TestUnnamedPortNumberChangeKeepsFaultSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	p := newTestProxier(t, Options{Faults: faults.NewTable(0, 0, faults.NewMetrics(reg))})
	unnamed := func(port int32) svcOpt {
		return func(s *v1.Service) { s.Spec.Ports[0].Name, s.Spec.Ports[0].Port = "", port }
	}
	const slow = `[{"name":"slow","type":"latency","attributes":{"latency":300}}]`
	count := func() int {
		t.Helper()
		n, err := testutil.GatherAndCount(reg, "kubeproxy_userspace_faulted_connections", "kubeproxy_userspace_faults_injected_total")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	old := makeService("web", unnamed(80), annotated(slow))
	p.OnServiceAdd(old)
	p.Sync()
	if n := count(); n != 2 {
		t.Fatalf("port 80 with a latency: %d series of faulted_connections and faults_injected_total, want 2", n)
	}
	svc := makeService("web", unnamed(81), annotated(slow))
	p.OnServiceUpdate(old, svc)
	p.Sync()
	if n := count(); n != 2 {
		t.Errorf("after 80 -> 81: %d series, want 2 (the port still has its latency)", n)
	}
	p.OnServiceDelete(svc)
	p.Sync()
	if n := count(); n != 0 {
		t.Errorf("after the Service is gone: %d series, want none", n)
	}
}

// A port reopened for a new address family (an IPv6 ClusterIP added)
// keeps what the fault API set on it: its toxics, and down stays down.
// Before, the reopen dropped the fault port, ending the experiment.
func TestFamilyChangeKeepsFaultAPIState(t *testing.T) {
	p := newTestProxier(t, Options{})
	svc := makeService("web", annotated(`[{"name":"slow","type":"latency","attributes":{"latency":300}}]`))
	p.OnServiceAdd(svc)
	p.Sync()
	const proxy = "default.web.p"
	if _, err := p.opts.Faults.AddToxic(proxy, faults.Toxic{Name: "cut", Type: "reset_peer"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.opts.Faults.SetEnabled(proxy, false); err != nil {
		t.Fatal(err)
	}
	before := p.active[p.lbName("default/web:p")].socket
	dual := makeService("web", annotated(`[{"name":"slow","type":"latency","attributes":{"latency":300}}]`))
	dual.Spec.ClusterIPs = []string{dual.Spec.ClusterIP, "fd00::10"}
	p.OnServiceUpdate(svc, dual)
	p.Sync()
	if p.active[p.lbName("default/web:p")].socket == before {
		t.Fatal("the port was not reopened for its new family; the test no longer covers the reopen")
	}
	info, err := p.opts.Faults.Proxy(proxy)
	if err != nil {
		t.Fatal(err)
	}
	if info.Enabled {
		t.Error("a port the API set down came back up when it was reopened for IPv6")
	}
	if got := declaredToxics(t, p, proxy); len(got) != 2 || got[0] != "slow/annotation" || got[1] != "cut/api" {
		t.Errorf("toxics after the reopen: %v, want [slow/annotation cut/api]", got)
	}
}

// Two updates during one sync: the annotation changed to b (valid, given to
// the port at once), then to something invalid (logged; the port keeps b).
// The sync, which parsed a, must leave the last valid one, b: it fell back
// to a, which then stood until the next change of the annotation (each
// later sync parses the invalid one and leaves the port alone).
func TestFaultAnnotationKeepsLastValidDuringSync(t *testing.T) {
	const (
		a   = `[{"name":"a","type":"latency","attributes":{"latency":100}}]`
		b   = `[{"name":"b","type":"latency","attributes":{"latency":200}}]`
		bad = `[{"name":"bad","type":"explode"}]`
	)
	p := newTestProxier(t, Options{})
	before, mid, invalid := makeService("web", annotated(a)), makeService("web", annotated(b)), makeService("web", annotated(bad))
	p.OnServiceAdd(before)
	listen := p.listen
	p.listen = func(name loadbalancer.ServicePortName, bind netip.Addr, port int, needIPv6 bool, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) (proxySocket, error) {
		p.listen = listen
		p.OnServiceUpdate(before, mid)
		p.OnServiceUpdate(mid, invalid)
		return listen(name, bind, port, needIPv6, sp, fp, cfg)
	}
	p.Sync()
	if got, want := declaredToxics(t, p, "default.web.p"), []string{"b/annotation"}; !slices.Equal(got, want) {
		t.Errorf("toxics after the sync: %v, want %v (the last valid annotation)", got, want)
	}
	p.Sync()
	if got, want := declaredToxics(t, p, "default.web.p"), []string{"b/annotation"}; !slices.Equal(got, want) {
		t.Errorf("toxics after the next sync: %v, want %v", got, want)
	}
}

// /debug/services says when a Service's faults annotation is not in force
// (from an API server, which stores any annotation): its row listed the
// last valid toxics, or none for a new Service, with nothing telling a
// test why its latency did not apply; only a log line did. A valid
// annotation clears it.
func TestDebugServicesShowInvalidFaults(t *testing.T) {
	faultsError := func(p *Proxier) string {
		t.Helper()
		rec := httptest.NewRecorder()
		p.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/services", nil))
		var rows []map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &rows); err != nil || len(rows) != 1 {
			t.Fatalf("/debug/services %s: %v", rec.Body, err)
		}
		s, _ := rows[0]["faultsError"].(string)
		return s
	}
	p := newTestProxier(t, Options{})
	bad := makeService("web", annotated(`[{"name":"slow","type":"latncy"}]`))
	p.OnServiceAdd(bad)
	p.Sync()
	if got := faultsError(p); !strings.Contains(got, `[0].type: unknown toxic type "latncy"`) {
		t.Errorf("a new Service with an invalid annotation: faultsError %q, want the annotation's error", got)
	}
	good := makeService("web", annotated(`[{"name":"slow","type":"latency","attributes":{"latency":300}}]`))
	p.OnServiceUpdate(bad, good)
	p.Sync()
	if got := faultsError(p); got != "" {
		t.Errorf("after a valid annotation: faultsError %q, want none", got)
	}
	p.OnServiceUpdate(good, makeService("web", annotated(`[{"name":"slow","type":"latency","attributes":{"latency":"300ms"}}]`)))
	p.Sync()
	if got := faultsError(p); !strings.Contains(got, `[0].attributes.latency: must be a number, not "300ms"`) {
		t.Errorf("an annotation turned invalid: faultsError %q, want the annotation's error", got)
	}
	if got := declaredToxics(t, p, "default.web.p"); !slices.Equal(got, []string{"slow/annotation"}) {
		t.Errorf("toxics %v, want the last valid ones", got)
	}
}
