package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// The faults annotation (issue 8) and the toxics the checks declare with it, in
// Toxiproxy's JSON shape; latencyFaults is the issue's own example. It names no port,
// so it acts on the TCP and the UDP port alike.
const (
	faultsAnnotation = "kube-userspace-proxy/faults"
	latencyFaults    = `[{"name":"slow","type":"latency","stream":"downstream","toxicity":1.0,"attributes":{"latency":300,"jitter":0}}]`
	resetFaults      = `[{"name":"cut","type":"reset_peer","stream":"downstream","toxicity":1.0,"attributes":{"timeout":0}}]`
	lossFaults       = `[{"name":"drop","type":"loss","port":"dns","stream":"upstream","toxicity":1.0,"attributes":{"rate":1}}]`
	unknownFaults    = `[{"name":"boom","type":"explode","toxicity":1.0}]`
)

const (
	// latencyAdded is what latencyFaults adds to every answer; a request through it
	// must be at least that much slower, and less than latencyCeiling slower.
	latencyAdded   = 300 * time.Millisecond
	latencyCeiling = 600 * time.Millisecond
	// faultSamples is how many requests each timing takes.
	faultSamples = 5
	// faultQuiet is the pause before each change: longer than
	// --iptables-min-sync-period, so that the rate limit does not hold the change back
	// and the figure is the fault path's own.
	faultQuiet = 1500 * time.Millisecond
	// faultBudget is the "live within 1 s of the change"; waits give up at
	// faultPatience, so a slow change is still measured.
	faultBudget   = time.Second
	faultPatience = 5 * time.Second
	// faultWindow is how long a check keeps asking after a change that must not take
	// effect: longer than a manifest reload and a rate-limited sync, so that a change
	// wrongly applied would show.
	faultWindow = 1500 * time.Millisecond
)

// Client addresses of pod1, one per fault check.
const (
	ipFaultLive = iota
	ipFaultInvalid
	ipFaultUDP
	ipFaultAPI
	faultClients
)

// faultServices are TestFaults' Services, one per check, all on b1 and without faults
// at start: every check declares its own, live.
func faultServices(c *netns.Cluster) map[string]svc {
	m := map[string]svc{}
	for i, name := range []string{"faulty", "stubborn", "lossy", "downed"} {
		m[name] = svc{name: name, clusterIP: fmt.Sprintf("10.96.0.%d", 90+i), endpoints: ips(c, 0)}
	}
	return m
}

// TestFaults declares faults on Services in the manifests directory and sees them
// through their ClusterIPs from a pod. It has a lab and a proxy of its own, and runs
// its checks one at a time: its figures are latencies, which TestProxy's parallel
// checks would blur.
func TestFaults(t *testing.T) {
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 1, ClientIPsEach: faultClients})
	e := &env{c: c, bs: c.StartBackends(t, backendBin, backendPort), svcs: faultServices(c), p: newProxy(t, c, "--fault-api-bind-address", faultAPIAddr)}
	for _, s := range e.svcs {
		writeSvc(t, e.p.dir, s)
	}
	e.p.Start(t, startWithin)
	warm := e.pod2(0)
	for _, s := range e.svcs {
		warm.WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)
		warm.WaitServed(t, "udp", s.udp(), time.Now(), startBudget)
	}
	for _, check := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"LatencyThenResetThenNone", checkFaultsLive},
		{"InvalidAnnotationKeepsLastFaults", checkFaultsInvalid},
		{"UDPLoss", checkFaultsUDPLoss},
		{"APIDownRefusesConnects", checkFaultsAPIDown},
	} {
		t.Run(check.name, func(t *testing.T) {
			e.p.RequireRunning(t)
			check.run(t, e)
		})
	}
}

// rewriteFaults writes s (its faults changed) after faultQuiet and waits until cl's
// requests to dst over proto show ok; it returns how long after the rename that took,
// and reports an error when that was over faultBudget.
func rewriteFaults(t *testing.T, e *env, s svc, cl harness.Client, proto string, what string, ok func(string, error) bool) time.Duration {
	t.Helper()
	dst := s.tcp()
	if proto == "udp" {
		dst = s.udp()
	}
	time.Sleep(faultQuiet)
	writeSvc(t, e.p.dir, s)
	took := cl.WaitFor(t, proto, dst, time.Now(), faultPatience, what, ok)
	if took > faultBudget {
		t.Errorf("%s %s: %s only %v after the manifest change; budget %v", proto, dst, what, took, faultBudget)
	}
	return took
}

// Outcomes of a poll (harness.PollTimeout per request) that tell a fault is in force.
// delayed is a connection made (through the portal and the proxy's accept) whose
// answer did not come in time; a dial that times out is no proof of anything.
func delayed(_ string, err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "read" && op.Timeout()
}
func reset(_ string, err error) bool      { return errors.Is(err, syscall.ECONNRESET) }
func unanswered(_ string, err error) bool { return err != nil }
func answeredBy(want string) func(string, error) bool {
	return func(name string, err error) bool { return err == nil && name == want }
}

// timedAsks asks dst n times (each a new connection or socket) and returns how long
// each answer took; any failure fails t.
func timedAsks(t *testing.T, cl harness.Client, proto string, dst netip.AddrPort, n int) []time.Duration {
	t.Helper()
	out := make([]time.Duration, n)
	for i := range out {
		began := time.Now()
		if _, err := cl.Ask(proto, dst, harness.AnswerTimeout); err != nil {
			t.Fatalf("%s %s from %s, request %d: %v", proto, dst, cl, i+1, err)
		}
		out[i] = time.Since(began)
	}
	return out
}

// median of ds (not empty).
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// checkAdded wants every request of slow to take at least latencyAdded (a latency
// toxic cannot make one faster), and the fastest of slow to be less than
// latencyCeiling above the fastest of base (a toxic applied twice makes every
// request that slow; a loaded machine makes some slower still, never faster:
// the median added 589-640 ms at load 24, with single requests at 0.9-2.1 s,
// while the fastest were 348 and 449 ms); it returns the median added.
func checkAdded(t *testing.T, what string, base, slow []time.Duration) time.Duration {
	t.Helper()
	added := median(slow) - median(base)
	least := slices.Min(slow)
	if least < latencyAdded {
		t.Errorf("%s: a request took %v with a %v latency toxic (all: %v)", what, least, latencyAdded, ms(slow))
	}
	if fastest := least - slices.Min(base); fastest >= latencyCeiling {
		t.Errorf("%s: the toxic added %v to the fastest request (%v against %v without it; all %v and %v); want less than %v",
			what, fastest, least, slices.Min(base), ms(slow), ms(base), latencyCeiling)
	}
	return added
}

// ms renders durations as whole milliseconds, for figures.
func ms(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = strconv.FormatInt(d.Milliseconds(), 10)
	}
	return strings.Join(parts, "/") + " ms"
}

// injected is kubeproxy_userspace_faults_injected_total of one toxic on one service
// port ("e2e/lossy:dns").
func injected(t *testing.T, e *env, servicePort, toxic string) float64 {
	t.Helper()
	var sum float64
	labels := []string{fmt.Sprintf("service_port=%q", servicePort), fmt.Sprintf("toxic=%q", toxic)}
	for _, line := range strings.Split(e.p.Get(t, "/metrics"), "\n") {
		if !strings.HasPrefix(line, "kubeproxy_userspace_faults_injected_total{") ||
			!strings.Contains(line, labels[0]) || !strings.Contains(line, labels[1]) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// declared lists the toxics /debug/services shows in force on a service port
// ("e2e/faulty:http"), each as "name/origin" (origin: annotation or api).
func declared(t *testing.T, e *env, servicePort string) []string {
	t.Helper()
	var rows []struct {
		ServicePort string `json:"servicePort"`
		Faults      []struct {
			Name   string `json:"name"`
			Origin string `json:"origin"`
		} `json:"faults"`
	}
	body := e.p.Get(t, "/debug/services")
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Fatalf("/debug/services: %v\n%s", err, body)
	}
	out := []string{}
	for _, r := range rows {
		if r.ServicePort == servicePort {
			for _, f := range r.Faults {
				out = append(out, f.Name+"/"+f.Origin)
			}
		}
	}
	return out
}

// checkDeclared wants /debug/services to list exactly want on each service port.
func checkDeclared(t *testing.T, e *env, want map[string][]string) {
	t.Helper()
	for port, w := range want {
		if got := declared(t, e, port); !slices.Equal(got, w) {
			t.Errorf("/debug/services lists %q in force on %s, want %q", got, port, w)
		}
	}
}
