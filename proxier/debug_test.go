package proxier

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
)

// A /debug/services row with faults decodes back into the type that wrote
// it (the embedded Toxic's strict decoder refused "origin").
func TestDebugServicePortJSONRoundTrip(t *testing.T) {
	row := DebugServicePort{
		ServicePort: "default/web:http", Protocol: "TCP", Port: 80,
		FaultProxy: "default/web:http", FaultsEnabled: true,
		Faults: []DebugToxic{
			{Toxic: faults.Toxic{Name: "slow", Type: "latency", Stream: faults.Downstream, Toxicity: 1, Attributes: map[string]float64{"latency": 300}}, Origin: "annotation"},
			{Toxic: faults.Toxic{Name: "cut", Type: "reset_peer", Stream: faults.Upstream, Toxicity: 0.5, Attributes: map[string]float64{"timeout": 0}}, Origin: "api"},
		},
	}
	b, err := json.Marshal([]DebugServicePort{row})
	if err != nil {
		t.Fatal(err)
	}
	var got []DebugServicePort
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	if len(got) != 1 || !reflect.DeepEqual(got[0], row) {
		t.Fatalf("round trip changed the row:\n got %+v\nwant %+v", got, row)
	}
	// A misspelt toxic field is still refused, naming it.
	var d DebugToxic
	if err := json.Unmarshal([]byte(`{"name":"x","typo":1,"origin":"api"}`), &d); err == nil {
		t.Error("an unknown toxic field was accepted")
	}
}

// /debug/services follows every sync, sorted by service port, whether the
// sync opened or closed sockets or only changed a Service in place. With 20
// other Services each step touches few enough rows that they are merged
// into the published ones, not rebuilt; a sync that changed nothing leaves
// the published rows as they were.
func TestDebugRowsFollowEverySync(t *testing.T) {
	p, _ := newPortalProxier(t)
	for i := range 20 {
		p.OnServiceAdd(makeService(fmt.Sprintf("bg%02d", i), withClusterIP(fmt.Sprintf("10.96.2.%d", i+1))))
	}
	row := func(servicePort string) string {
		for _, d := range p.DebugServices() {
			if d.ServicePort == servicePort {
				return fmt.Sprintf("%s %d", d.ServicePort, d.NodePort)
			}
		}
		return servicePort + " absent"
	}
	// merged: the step must not rebuild the rows from scratch.
	check := func(step string, merged bool, want ...string) {
		t.Helper()
		rebuilds := p.debugRebuilds
		p.Sync()
		if merged && p.debugRebuilds != rebuilds {
			t.Errorf("%s: the rows were rebuilt, not merged", step)
		}
		if full := p.debugRows(); !reflect.DeepEqual(p.debug, full) {
			t.Fatalf("%s: merged rows %+v, built from scratch %+v", step, p.debug, full)
		}
		for _, w := range want {
			name, _, _ := strings.Cut(w, " ")
			if got := row(name); got != w {
				t.Fatalf("%s: row %q, want %q", step, got, w)
			}
		}
	}
	p.OnServiceAdd(makeService("web", withClusterIP("10.96.0.30")))
	p.OnServiceAdd(makeService("api", withClusterIP("10.96.0.20")))
	check("two Services", false, "default/api:p 0", "default/web:p 0")

	old := makeService("web", withClusterIP("10.96.0.30"))
	p.OnServiceUpdate(old, makeService("web", withClusterIP("10.96.0.30"), withNodePort(30080)))
	check("a Service changed in place", true, "default/api:p 0", "default/web:p 30080")
	published := p.debug
	check("nothing changed", true, "default/api:p 0", "default/web:p 30080")
	if &p.debug[0] != &published[0] {
		t.Error("a sync that changed nothing published new rows")
	}

	p.OnServiceAdd(makeService("cache", withClusterIP("10.96.0.40")))
	check("one added", true, "default/api:p 0", "default/cache:p 0", "default/web:p 30080")
	p.OnServiceDelete(makeService("api", withClusterIP("10.96.0.20")))
	check("one deleted", true, "default/api:p absent", "default/cache:p 0")
	p.OnServiceDelete(makeService("cache", withClusterIP("10.96.0.40")))
	p.OnServiceAdd(makeService("auth", withClusterIP("10.96.0.50")))
	check("one replaced by another", true, "default/cache:p absent", "default/auth:p 0")
	// An address family change reopens the socket: closed and opened in
	// one sync, the row stays once, with the new socket's port. (Dual-stack:
	// an IPv6-only Service is not served with IPv4 portals only.)
	dual := func(s *v1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.50", []string{"10.96.0.50", "fd00::50"}
	}
	p.OnServiceUpdate(makeService("auth", withClusterIP("10.96.0.50")), makeService("auth", dual))
	check("one reopened", true, "default/auth:p 0")
	// A protocol change closes one name and opens another of the same key;
	// a row after it changes in the same sync.
	p.OnServiceUpdate(makeService("auth", dual), makeService("auth", dual, withProtocol(v1.ProtocolUDP)))
	p.OnServiceUpdate(old, makeService("web", withClusterIP("10.96.0.30"), withNodePort(30081)))
	check("protocol changed", true, "default/auth:p 0", "default/web:p 30081")
	for range 3 {
		p.OnServiceAdd(makeService(fmt.Sprintf("svc%d", rand.IntN(1000)), withClusterIP("10.96.1.1")))
	}
	p.OnServiceDelete(makeService("bg07", withClusterIP("10.96.2.8")))
	check("random adds and a delete", true, "default/bg07:p absent")
	for i := range 20 {
		p.OnServiceDelete(makeService(fmt.Sprintf("bg%02d", i), withClusterIP(fmt.Sprintf("10.96.2.%d", i+1))))
	}
	check("most deleted (rebuilt)", false, "default/bg00:p absent", "default/web:p 30081")
}

// TestDebugProxyAddressShowsTheBindAddress: with --bind-address :: the proxy
// sockets listen on every address of both families, and /debug/services
// says [::]:PORT; it said 0.0.0.0:PORT, which an IPv6 client cannot use.
func TestDebugProxyAddressShowsTheBindAddress(t *testing.T) {
	for _, tt := range []struct {
		bind       string
		clusterIPs []string
		wantHost   string
	}{
		{"::", nil, "::"},
		{"0.0.0.0", nil, "0.0.0.0"},
		// A port with an IPv6 address listens in both families.
		{"0.0.0.0", []string{"10.96.0.10", "fd00::10"}, "::"},
		{"127.0.0.1", nil, "127.0.0.1"},
	} {
		t.Run(tt.bind+strings.Join(tt.clusterIPs, ","), func(t *testing.T) {
			p := newTestProxier(t, Options{BindAddress: netip.MustParseAddr(tt.bind)})
			p.OnServiceAdd(makeService("web", func(s *v1.Service) {
				if tt.clusterIPs != nil {
					s.Spec.ClusterIPs = tt.clusterIPs
				}
			}))
			p.Sync()
			rows := p.DebugServices()
			if len(rows) != 1 {
				t.Fatalf("%d rows", len(rows))
			}
			host, _, err := net.SplitHostPort(rows[0].ProxyAddress)
			if err != nil || host != tt.wantHost {
				t.Fatalf("proxyAddress %q, want host %s", rows[0].ProxyAddress, tt.wantHost)
			}
		})
	}
}
