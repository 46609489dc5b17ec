package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
)

// A node whose ip6tables has no nat table (no ip6table_nat, IPv6 disabled
// at boot) is served in IPv4, as kube-proxy does after its start-up probe:
// syncs succeed, a dual-stack Service's IPv4 portal is written, /healthz
// turns ready, and IPv6 is reported unsupported once, not per sync.
func TestNodeWithoutIPv6NAT(t *testing.T) {
	logs := captureKlog(t)
	r4, r6 := iptables.NewFakeRunner(iptables.IPv4), iptables.NewFakeRunner(iptables.IPv6)
	r6.RemoveTable(iptables.TableNAT)
	v4, v6, err := portalSyncers(context.Background(), &validated{bind: netip.MustParseAddr("127.0.0.1")}, func(f iptables.Family) (iptables.Runner, error) {
		if f == iptables.IPv6 {
			return r6, nil
		}
		return r4, nil
	})
	if err != nil {
		t.Fatalf("portalSyncers: %v", err)
	}
	health := healthcheck.NewProxierHealth(clock.RealClock{}, time.Minute)
	p := syncedDualStack(t, proxier.Options{IPv4Portals: v4, IPv6Portals: v6, Health: health}, "web", "10.96.0.10", "fd00::10")
	p.SyncFull()
	p.Sync()

	rec := httptest.NewRecorder()
	health.Handler(false, nil).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("/healthz = %d %s, want 200 (ready)", rec.Code, rec.Body)
	}
	if rules := strings.Join(r4.Rules(iptables.TableNAT, iptables.ChainPortalsContainer), "\n"); !strings.Contains(rules, "10.96.0.10/32") {
		t.Errorf("IPv4 portal of default/web:http not written; %s holds:\n%s", iptables.ChainPortalsContainer, rules)
	}
	if w := r6.CallsOf("Restore"); w != 0 {
		t.Errorf("%d restores tried on the IPv6 runner; its family is not supported", w)
	}
	klog.Flush()
	if n := strings.Count(logs.String(), "No iptables support for family"); n != 1 {
		t.Errorf("IPv6 reported unsupported %d times, want once; log:\n%s", n, logs)
	}
}

// A --bind-address that names one address takes one family: the other
// family gets no portals (its traffic was REDIRECTed or DNATed to a socket
// that could not take it, and refused), and a dual-stack Service is served
// in the bind address's family.
func TestBindAddressOfOneFamily(t *testing.T) {
	for _, tc := range []struct {
		bind      string
		want, not iptables.Family
		wantAddr  string
	}{
		{"10.236.1.1", iptables.IPv4, iptables.IPv6, "10.96.0.20/32"},
		{"fd36::1", iptables.IPv6, iptables.IPv4, "fd36:96::20/128"},
	} {
		t.Run(tc.bind, func(t *testing.T) {
			runners := map[iptables.Family]*iptables.FakeRunner{
				iptables.IPv4: iptables.NewFakeRunner(iptables.IPv4), iptables.IPv6: iptables.NewFakeRunner(iptables.IPv6),
			}
			// What a run with both families left in the family this one
			// does not serve: removed at start, as no syncer repairs it.
			stale := runners[tc.not]
			if err := stale.NewChain(iptables.TableNAT, iptables.ChainPortalsContainer); err != nil {
				t.Fatal(err)
			}
			if err := stale.AppendRule(iptables.TableNAT, iptables.ChainPortalsContainer, "-p", "tcp", "-j", "REDIRECT", "--to-ports", "61254"); err != nil {
				t.Fatal(err)
			}
			bind := netip.MustParseAddr(tc.bind)
			v4, v6, err := portalSyncers(context.Background(), &validated{bind: bind}, func(f iptables.Family) (iptables.Runner, error) { return runners[f], nil })
			if err != nil {
				t.Fatalf("portalSyncers: %v", err)
			}
			if chains := stale.Chains(iptables.TableNAT); slices.Contains(chains, iptables.ChainPortalsContainer) {
				t.Errorf("the %v rules of an earlier run stay: nat chains %v", tc.not, chains)
			}
			syncedDualStack(t, proxier.Options{IPv4Portals: v4, IPv6Portals: v6}, "ds", "10.96.0.20", "fd36:96::20")
			if rules := strings.Join(runners[tc.want].Rules(iptables.TableNAT, iptables.ChainPortalsContainer), "\n"); !strings.Contains(rules, tc.wantAddr) {
				t.Errorf("%v portal of default/ds:http not written; %s holds:\n%s", tc.want, iptables.ChainPortalsContainer, rules)
			}
			if n := runners[tc.not].CallsOf("Restore"); n != 0 {
				t.Errorf("%d restores on the %v runner; --bind-address %s takes no %v traffic", n, tc.not, tc.bind, tc.not)
			}
		})
	}
}

// syncedDualStack is a proxier with opts (its sockets on loopback: these
// tests read the rules) that has synced one dual-stack Service, name,
// with port http/80; it is stopped at the end of the test.
func syncedDualStack(t *testing.T, opts proxier.Options, name string, clusterIPs ...string) *proxier.Proxier {
	t.Helper()
	opts.BindAddress = netip.MustParseAddr("127.0.0.1")
	p := proxier.New(opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		p.Run(ctx) // closes the proxy sockets
	})
	p.OnServiceAdd(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIPs[0], ClusterIPs: clusterIPs,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	})
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.Sync()
	return p
}

// iptables missing from PATH (privileges are checked before, with their
// own message) says what to install, once: it said "iptables: iptables:
// exec: ... not found in $PATH (run as root with iptables installed, or use
// --iptables=false)" to a root user.
func TestIptablesNotInstalled(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, _, err := portalSyncers(context.Background(), &validated{bind: netip.MustParseAddr("0.0.0.0")}, iptables.NewRunner)
	if err == nil {
		t.Fatal("no error without iptables on PATH")
	}
	msg := err.Error()
	for _, want := range []string{`"iptables": executable file not found`, "install iptables", "--iptables=false"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "iptables: iptables:") || strings.Contains(msg, "run as root") {
		t.Errorf("error repeats its prefix or blames privileges: %s", msg)
	}
}
