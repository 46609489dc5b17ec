package proxier

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// The change path (Service events, then a sync that parses only the
// Services that changed, skips unchanged service ports and writes only the
// rule deltas) must end where a fresh proxier given the final Services
// ends after its first, full sync: the same rules in every chain of both
// families (proxy ports compared by the service port that owns them), the
// same service-port table, balancer, traffic policies, healthCheckNodePorts,
// connection lifetimes and fault ports. Random sequences move Services
// through types, addresses shared with other Services, policies, affinity,
// annotations, renamed ports, protocol changes, deletes and re-adds within
// one sync, proxy sockets that fail to open, iptables writes and reads and
// healthCheckNodePort servers that fail, all retried by the next sync.
func TestChangePathMatchesFreshProxier(t *testing.T) {
	for _, tc := range []struct {
		name        string
		bucketAbove int // 0: iptables' default, which these few rules never reach
	}{
		{"unbucketed", 0},
		// A few Services' rules go past 8 and back, so the chains move in
		// and out of buckets through Update as well as through full syncs.
		{"buckets", 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(len(tc.name))))
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			w := newEquivWorld(t, clk, tc.bucketAbove)
			current := map[string]*v1.Service{}
			for _, name := range equivNames {
				w.p.OnEndpointSliceAdd(equivSlice(name))
			}
			w.p.Sync()
			fullSyncs, bucketed, unbucketed := 0, 0, 0
			for step := range 300 {
				for range 1 + rng.Intn(3) {
					name := equivNames[rng.Intn(len(equivNames))]
					switch op := rng.Intn(10); {
					case op < 6:
						svc := randomService(rng, name)
						w.p.OnServiceUpdate(current[name], svc)
						current[name] = svc
					case op < 8:
						if old := current[name]; old != nil {
							w.p.OnServiceDelete(old)
							delete(current, name)
						}
					default: // deleted and added again before the sync
						if old := current[name]; old != nil {
							w.p.OnServiceDelete(old)
						}
						svc := randomService(rng, name)
						w.p.OnServiceAdd(svc)
						current[name] = svc
					}
				}
				// Sometimes a proxy socket fails to open this sync: the
				// whole service port, or only its external socket.
				clear(w.fail)
				if rng.Intn(4) == 0 {
					for _, svc := range current {
						for _, info := range servicePorts(svc) {
							if rng.Intn(3) == 0 {
								w.fail[info.key] = 1 + rng.Intn(2)
							}
						}
					}
				}
				// Sometimes a family's iptables fails this sync: a table's
				// restore (the other table's section committed), every
				// restore, or the read-back.
				failing := rng.Intn(8) == 0
				if failing {
					f := pick(rng, w.v4, w.v6)
					f.Errors = map[string]error{pick(rng, "Restore nat", "Restore filter", "Restore", "Save"): errors.New("injected iptables failure")}
				}
				if rng.Intn(8) == 0 {
					failing = true
					w.health.setErr(errors.New("injected healthCheckNodePort failure"))
				}
				clk.Step(time.Second)
				if rng.Intn(15) == 0 {
					w.p.SyncFull()
					fullSyncs++
				} else {
					w.p.Sync()
				}
				if len(w.fail) > 0 || failing {
					// The next sync retries what failed.
					clear(w.fail)
					w.v4.Errors, w.v6.Errors = nil, nil
					w.health.setErr(nil)
					clk.Step(time.Second)
					w.p.Sync()
				}
				if slices.Contains(w.v4.Chains(iptables.TableNAT), iptables.ChainPortalsContainer+"-00") {
					bucketed++
				} else {
					unbucketed++
				}

				fresh := newEquivWorld(t, clk, tc.bucketAbove)
				for _, svc := range current {
					fresh.p.OnServiceAdd(svc)
				}
				for _, name := range equivNames {
					fresh.p.OnEndpointSliceAdd(equivSlice(name))
				}
				fresh.p.Sync()
				got, want := w.state(t), fresh.state(t)
				if got != want {
					t.Fatalf("step %d: the change path diverged from a fresh proxier (-changed +fresh):\n%s\nServices:\n%s",
						step, lineDiff(got, want), describeServices(current))
				}
				fresh.stop()
				if step%30 == 29 {
					checkRestart(t, clk, w, current)
				}
			}
			t.Logf("300 syncs (%d periodic), chains bucketed after %d", fullSyncs, bucketed)
			if fullSyncs == 0 {
				t.Errorf("no periodic sync among 300")
			}
			if tc.bucketAbove > 0 && (bucketed < 30 || unbucketed < 30) {
				t.Errorf("chains bucketed after %d syncs, not after %d: want both often", bucketed, unbucketed)
			}
		})
	}
}

var equivNames = []string{"s0", "s1", "s2", "s3", "s4"}

// equivWorld is a proxier on fake iptables runners of both families whose
// proxy sockets open nothing (and fail to open on demand).
type equivWorld struct {
	p      *Proxier
	v4, v6 *iptables.FakeRunner
	health *recordingHealth
	// fail makes listen fail for a service port (by key): 1 every
	// socket, 2 only its external one.
	fail map[string]int
	stop func()
}

// recordingHealth keeps the last healthCheckNodePorts it accepted; with
// err set it refuses them.
type recordingHealth struct {
	mu   sync.Mutex
	last map[types.NamespacedName]int
	err  error
}

func (h *recordingHealth) SyncServices(ports map[types.NamespacedName]int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return h.err
	}
	h.last = maps.Clone(ports)
	return nil
}

func (h *recordingHealth) setErr(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = err
}

func newEquivWorld(t *testing.T, clk *clocktesting.FakeClock, bucketAbove int) *equivWorld {
	t.Helper()
	w := &equivWorld{
		v4:     iptables.NewFakeRunner(iptables.IPv4),
		v6:     iptables.NewFakeRunner(iptables.IPv6),
		health: &recordingHealth{},
		fail:   map[string]int{},
	}
	cfg := func(f iptables.Family) iptables.Config {
		return iptables.Config{
			Family:            f,
			NodeIP:            mustAddr("10.0.0.1"),
			ClusterCIDRs:      []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd01::/48")},
			NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("fd02::/64")},
		}
	}
	v4, v6 := iptables.New(w.v4, cfg(iptables.IPv4)), iptables.New(w.v6, cfg(iptables.IPv6))
	if bucketAbove > 0 {
		v4.SetBucketAbove(bucketAbove)
		v6.SetBucketAbove(bucketAbove)
	}
	w.p = New(Options{
		IPv4Portals:   v4,
		IPv6Portals:   v6,
		PortRange:     PortRange{Base: 40000, Size: 5000},
		Clock:         clk,
		SyncPeriod:    time.Hour,
		NodeName:      "n1",
		ServiceHealth: w.health,
	})
	w.p.lb.KeepOrder() // endpoints in slice order, not shuffled
	w.p.listen = func(name loadbalancer.ServicePortName, _ netip.Addr, port int, _ bool, _ *loadbalancer.ServicePort, _ *faults.Port, _ *socketConfig) (proxySocket, error) {
		switch w.fail[name.String()] {
		case 1:
			return nil, errors.New("injected listen failure")
		case 2:
			if w.p.active[name] != nil { // the external socket
				return nil, errors.New("injected listen failure")
			}
		}
		return planSocket(port), nil
	}
	w.p.OnServiceSynced()
	w.p.OnEndpointSlicesSynced()
	var once sync.Once
	w.stop = func() {
		once.Do(func() {
			w.p.syncMu.Lock()
			defer w.p.syncMu.Unlock()
			for name, ap := range w.p.active {
				w.p.closePort(name, ap)
			}
		})
	}
	t.Cleanup(w.stop)
	return w
}

var proxyPortRE = regexp.MustCompile(`\b4\d{4}\b`)

// groupedChain reports whether chain is, or is a bucket of, a chain whose
// rules group proxy ports by number, and which.
func groupedChain(chain string) (string, bool) {
	for _, c := range []string{iptables.ChainProxyPortGuard, iptables.ChainPortalsNonLocal, iptables.ChainProxyPortReject} {
		if strings.HasPrefix(chain, c) {
			return c, true
		}
	}
	return "", false
}

// guardCoverage returns, for each port the guard chain covers (directly
// or through a bucket it jumps to), "PROTO PORT: the rest of its rule";
// a rule it cannot read is returned as written.
func guardCoverage(f *iptables.FakeRunner, table iptables.Table, chain string) []string {
	var out []string
	for _, rule := range f.Rules(table, chain) {
		if to, ok := strings.CutPrefix(rule, "-j "); ok && strings.HasPrefix(to, chain+"-") {
			out = append(out, guardCoverage(f, table, to)...)
			continue
		}
		proto, ports, rest, ok := iptables.GuardRulePorts(rule)
		if !ok {
			out = append(out, rule)
			continue
		}
		for _, port := range ports {
			out = append(out, fmt.Sprintf("%s %d: %s", proto, port, rest))
		}
	}
	return out
}

// state prints everything the test compares, proxy ports replaced by the
// service port (and socket) that owns them.
func (w *equivWorld) state(t *testing.T) string {
	t.Helper()
	p := w.p
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	owner := map[string]string{}
	var ports []string
	for name, ap := range p.active {
		owner[strconv.Itoa(ap.proxyPort)] = "<" + name.String() + "/" + string(name.Protocol) + ">"
		line := fmt.Sprintf("port %s/%s", name, name.Protocol)
		if ap.external != nil {
			owner[strconv.Itoa(ap.externalPort)] = "<" + name.String() + "/" + string(name.Protocol) + " external>"
			line += " +external"
		}
		ports = append(ports, line)
	}
	norm := func(s string) string {
		return proxyPortRE.ReplaceAllStringFunc(s, func(n string) string {
			if o, ok := owner[n]; ok {
				return o
			}
			return "<unowned " + n + ">"
		})
	}
	var b strings.Builder
	slices.Sort(ports)
	for _, l := range ports {
		b.WriteString(l + "\n")
	}
	for _, f := range []*iptables.FakeRunner{w.v4, w.v6} {
		var guarded []string
		for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
			chains := f.Chains(table)
			slices.Sort(chains)
			for _, chain := range chains {
				if grouped, ok := groupedChain(chain); ok {
					// Guard rules group ports by number (iptables/guard.go),
					// and so do the portals' accepts and rejects, which differs between
					// the two worlds, and so may their count and thus the
					// buckets: compare the ports the chain covers, through
					// the buckets it jumps to, with what each rule does to
					// them.
					if chain == grouped {
						for _, g := range guardCoverage(f, table, chain) {
							guarded = append(guarded, norm(fmt.Sprintf("%v %s covers %s", f.Family(), chain, g)))
						}
					}
					continue
				}
				b.WriteString(fmt.Sprintf("%v %s :%s\n", f.Family(), table, chain))
				for _, r := range f.Rules(table, chain) {
					b.WriteString(norm(fmt.Sprintf("%v %s -A %s %s", f.Family(), table, chain, r)) + "\n")
				}
			}
		}
		slices.Sort(guarded)
		for _, l := range guarded {
			b.WriteString(l + "\n")
		}
	}
	for _, row := range p.DebugServices() {
		row.ProxyAddress = norm(row.ProxyAddress)
		row.ExternalProxyAddress = norm(row.ExternalProxyAddress)
		j, err := json.Marshal(row)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("debug " + string(j) + "\n")
	}
	for _, name := range p.lb.ServicePortNames() {
		snap, _ := p.lb.Snapshot(name)
		b.WriteString(fmt.Sprintf("balancer %s/%s %+v %v\n", name, name.Protocol, snap.Affinity, snap.Endpoints))
	}
	p.endpoints.mu.Lock()
	pols := maps.Clone(p.endpoints.policies)
	p.endpoints.mu.Unlock()
	for _, nn := range slices.SortedFunc(maps.Keys(pols), func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) }) {
		b.WriteString(fmt.Sprintf("policy %s %+v\n", nn, pols[nn]))
	}
	w.health.mu.Lock()
	b.WriteString(fmt.Sprintf("healthCheckNodePorts %v\n", w.health.last))
	w.health.mu.Unlock()
	var lifetimes []string
	p.sockCfg.lifetimes.ports.Range(func(k, v any) bool {
		name := k.(loadbalancer.ServicePortName)
		lifetimes = append(lifetimes, fmt.Sprintf("lifetime %s/%s %+v", name, name.Protocol, v.(*portLifetime).load()))
		return true
	})
	slices.Sort(lifetimes)
	for _, l := range lifetimes {
		b.WriteString(l + "\n")
	}
	for _, fp := range p.opts.Faults.Proxies() {
		fp.Listen, fp.Upstream = norm(fp.Listen), ""
		j, err := json.Marshal(fp)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("fault port " + string(j) + "\n")
	}
	return b.String()
}

func lineDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	inG, inW := map[string]int{}, map[string]int{}
	for _, l := range g {
		inG[l]++
	}
	for _, l := range w {
		inW[l]++
	}
	var b strings.Builder
	for _, l := range g {
		if inW[l] == 0 {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range w {
		if inG[l] == 0 {
			b.WriteString("+ " + l + "\n")
		}
	}
	if b.Len() == 0 {
		return "(same lines, another order)\n--- changed\n" + got + "\n--- fresh\n" + want
	}
	return b.String()
}

func describeServices(svcs map[string]*v1.Service) string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(svcs)) {
		s := svcs[name]
		out = append(out, fmt.Sprintf("  %s: %s clusterIPs=%v ports=%+v externalIPs=%v lb=%v etp=%s itp=%v affinity=%s annotations=%v",
			name, s.Spec.Type, s.Spec.ClusterIPs, s.Spec.Ports, s.Spec.ExternalIPs, s.Status.LoadBalancer.Ingress,
			s.Spec.ExternalTrafficPolicy, ptr.Deref(s.Spec.InternalTrafficPolicy, ""), s.Spec.SessionAffinity, s.Annotations))
	}
	return strings.Join(out, "\n")
}

func pick[T any](rng *rand.Rand, from ...T) T { return from[rng.Intn(len(from))] }

// randomService draws a Service from a small space, so that Services share
// addresses and ports and a change often keeps most of a Service.
func randomService(rng *rand.Rand, name string) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	s.Spec.Type = pick(rng, v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer)
	switch rng.Intn(6) {
	case 0:
		s.Spec.ClusterIPs = []string{pick(rng, "10.96.0.1", "10.96.0.2"), pick(rng, "fd00::1", "fd00::2")}
	case 1:
		s.Spec.ClusterIPs = []string{pick(rng, "fd00::1", "fd00::2")}
	default:
		s.Spec.ClusterIPs = []string{pick(rng, "10.96.0.1", "10.96.0.2", "10.96.0.3")}
	}
	s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	portNames := pick(rng, []string{""}, []string{"a"}, []string{"b"}, []string{"a", "b"})
	for _, pn := range portNames {
		sp := v1.ServicePort{Name: pn, Port: int32(pick(rng, 80, 81, 443)), Protocol: pick(rng, v1.ProtocolTCP, v1.ProtocolUDP)}
		if s.Spec.Type != v1.ServiceTypeClusterIP {
			sp.NodePort = int32(30000 + rng.Intn(4))
		}
		s.Spec.Ports = append(s.Spec.Ports, sp)
	}
	for range rng.Intn(3) {
		s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, pick(rng, "192.0.2.1", "192.0.2.2", "2001:db8::1"))
	}
	if s.Spec.Type == v1.ServiceTypeLoadBalancer {
		for range rng.Intn(3) {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: pick(rng, "198.51.100.1", "198.51.100.2", "2001:db8::2")})
		}
	}
	if s.Spec.Type != v1.ServiceTypeClusterIP || len(s.Spec.ExternalIPs) > 0 {
		s.Spec.ExternalTrafficPolicy = pick(rng, v1.ServiceExternalTrafficPolicyCluster, v1.ServiceExternalTrafficPolicyLocal)
		if s.Spec.Type == v1.ServiceTypeLoadBalancer && s.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
			s.Spec.HealthCheckNodePort = int32(pick(rng, 32000, 32001))
		}
	}
	if rng.Intn(4) == 0 {
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}
	if rng.Intn(5) == 0 {
		s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferSameNode)
	}
	// Now and then nothing to proxy: a source that passes them on hands
	// the proxier ExternalName and headless Services too.
	switch rng.Intn(15) {
	case 0:
		s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeExternalName, "example.com"
	case 1:
		s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.ExternalIPs = v1.ServiceTypeClusterIP, v1.ClusterIPNone, []string{v1.ClusterIPNone}, nil
		s.Status.LoadBalancer.Ingress = nil
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = 0
		}
	}
	if rng.Intn(3) == 0 {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		if rng.Intn(2) == 0 {
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(pick(rng, 10, 60)))}}
		}
	}
	s.Annotations = map[string]string{}
	if age := pick(rng, "", "", "30s", "5m"); age != "" {
		s.Annotations[config.MaxConnectionAgeAnnotation] = age
	}
	if rng.Intn(3) == 0 {
		s.Annotations[config.DrainRemovedAnnotation] = pick(rng, "10s", "1m")
	}
	if rng.Intn(3) == 0 {
		// Valid for TCP and UDP ports: an invalid annotation keeps the
		// last valid toxics, which a fresh proxier never saw.
		s.Annotations[faults.Annotation] = pick(rng,
			`[{"name":"slow","type":"latency","attributes":{"latency":300}}]`,
			`[{"name":"slower","type":"latency","attributes":{"latency":900}}]`)
	}
	return s
}

// equivSlice gives Service name endpoints on this node and another, for
// every port name and protocol randomService uses.
func equivSlice(name string) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: name + "-abc",
			Labels: map[string]string{discovery.LabelServiceName: name},
		},
		AddressType: discovery.AddressTypeIPv4,
	}
	for _, pn := range []string{"", "a", "b"} {
		for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
			es.Ports = append(es.Ports, discovery.EndpointPort{Name: ptr.To(pn), Port: ptr.To(int32(8080)), Protocol: ptr.To(proto)})
		}
	}
	for i, node := range []string{"n1", "n2"} {
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.244.%d.5", i)},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true)},
			NodeName:   ptr.To(node),
		})
	}
	return es
}

// checkRestart starts proxiers over copies of w's rules, with either chain
// layout (an upgrade that splits 1,024-rule chains into buckets, or the
// way back), and checks that their first sync leaves what a fresh proxier
// leaves, and that --cleanup then removes every chain and jump of ours.
func checkRestart(t *testing.T, clk *clocktesting.FakeClock, w *equivWorld, current map[string]*v1.Service) {
	t.Helper()
	for _, bucketAbove := range []int{0, 12} {
		restarted, fresh := newEquivWorld(t, clk, bucketAbove), newEquivWorld(t, clk, bucketAbove)
		for _, pair := range [][2]*iptables.FakeRunner{{w.v4, restarted.v4}, {w.v6, restarted.v6}} {
			for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
				saved, err := pair[0].Save(table)
				if err != nil {
					t.Fatal(err)
				}
				if err := pair[1].Restore(saved); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, x := range []*equivWorld{restarted, fresh} {
			for _, svc := range current {
				x.p.OnServiceAdd(svc)
			}
			for _, name := range equivNames {
				x.p.OnEndpointSliceAdd(equivSlice(name))
			}
			x.p.Sync()
		}
		if got, want := restarted.state(t), fresh.state(t); got != want {
			t.Fatalf("restart with bucketAbove=%d over the rules left by the change path differs from a fresh proxier (-restarted +fresh):\n%s\nServices:\n%s",
				bucketAbove, lineDiff(got, want), describeServices(current))
		}
		for _, f := range []*iptables.FakeRunner{restarted.v4, restarted.v6} {
			if err := iptables.Cleanup(f); err != nil {
				t.Fatalf("cleanup: %v", err)
			}
			for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
				for _, chain := range f.Chains(table) {
					if rules := f.Rules(table, chain); strings.HasPrefix(chain, "KUBE-") || len(rules) > 0 {
						t.Fatalf("after cleanup %v %s holds chain %s with %q", f.Family(), table, chain, rules)
					}
				}
			}
		}
		restarted.stop()
		fresh.stop()
	}
}
