package proxier

import (
	"context"
	"errors"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

func TestRetryBackoff(t *testing.T) {
	for _, c := range []struct {
		failingFor, min, max, want time.Duration
	}{
		{0, time.Second, 30 * time.Second, time.Second},
		{time.Second, time.Second, 30 * time.Second, 2 * time.Second},
		{15 * time.Second, time.Second, 30 * time.Second, 16 * time.Second},
		{31 * time.Second, time.Second, 30 * time.Second, 30 * time.Second},
		{time.Hour, time.Second, 30 * time.Second, 30 * time.Second},
		{0, 0, 30 * time.Second, time.Second}, // at least a second
		{0, 5 * time.Second, 30 * time.Second, 5 * time.Second},
		{20 * time.Second, 10 * time.Second, 30 * time.Second, 30 * time.Second},
		{time.Second, time.Second, 500 * time.Millisecond, time.Second},
		{-time.Second, time.Second, 30 * time.Second, time.Second}, // a clock stepped back
		// A "never" of a min-sync-period plus the time failing wrapped
		// negative: a retry every second.
		{time.Second, math.MaxInt64, math.MaxInt64, math.MaxInt64},
		{time.Hour, 2562047 * time.Hour, 2562047 * time.Hour, 2562047 * time.Hour},
	} {
		if got := retryBackoff(c.failingFor, c.min, c.max); got != c.want {
			t.Errorf("retryBackoff(%v, %v, %v) = %v, want %v", c.failingFor, c.min, c.max, got, c.want)
		}
	}
}

// A run that asks for a retry gets one after the time it asked for, with
// no trigger; a run that does not ask gets none.
func TestRunnerRetryAfter(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	var runs atomic.Int32
	var r *boundedFrequencyRunner
	r = newBoundedFrequencyRunner(func(periodic bool) {
		if periodic {
			t.Error("a retry was called periodic")
		}
		if runs.Add(1) == 1 {
			r.RetryAfter(10 * time.Second)
			r.RetryAfter(5 * time.Second) // the sooner wins
		}
	}, time.Second, time.Minute, clk)
	runInBackground(t, r.Loop)

	r.Run()
	waitFor(t, "first run", func() bool { return runs.Load() == 1 })
	waitFor(t, "retry armed", func() bool { return clk.Waiters() == 2 })
	clk.Step(4 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if n := runs.Load(); n != 1 {
		t.Fatalf("retried after 4s of 5s (%d runs)", n)
	}
	clk.Step(time.Second)
	waitFor(t, "the retry", func() bool { return runs.Load() == 2 })
	waitFor(t, "periodic timer re-armed", func() bool { return clk.Waiters() == 1 })
	clk.Step(30 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if n := runs.Load(); n != 2 {
		t.Fatalf("a run that asked for no retry got one (%d runs)", n)
	}
}

// A proxy socket whose port is taken opens by itself once the port is free,
// without a Service change and well before the sync period: the retries
// come after 1 s, then 2 s.
func TestOpenFailureIsRetried(t *testing.T) {
	holder, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	port := holder.Addr().(*net.TCPAddr).Port
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p := New(Options{BindAddress: mustAddr("127.0.0.1"), Clock: clk, PortRange: PortRange{Base: port, Size: 1},
		MinSyncPeriod: time.Second, SyncPeriod: time.Hour})
	runInBackground(t, p.Run)
	failedSyncs := func() int {
		p.syncMu.Lock()
		defer p.syncMu.Unlock()
		return p.failedSyncs
	}
	serving := func() bool { _, ok := p.ProxyPort("default/web:p"); return ok }

	// The Service first: the sources' sync is then the one trigger (a
	// second one would queue a run behind a min-sync-period wait).
	p.OnServiceAdd(makeService("web"))
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	// The fake clock's waiters: the periodic sync, the affinity sweep's
	// ticker and the retry.
	waitFor(t, "the first sync to fail", func() bool { return failedSyncs() == 1 })
	waitFor(t, "retry armed", func() bool { return clk.Waiters() == 3 })
	clk.Step(time.Second)
	waitFor(t, "the first retry to fail", func() bool { return failedSyncs() == 2 })
	waitFor(t, "retry armed", func() bool { return clk.Waiters() == 3 })
	clk.Step(time.Second)
	time.Sleep(20 * time.Millisecond)
	if n := failedSyncs(); n != 2 || serving() {
		t.Fatalf("the second retry came after 1 s, not 2 s (failed syncs %d, serving %v)", n, serving())
	}
	holder.Close()
	clk.Step(time.Second)
	waitFor(t, "the port to open on the retry", serving)
	if got, _ := p.ProxyPort("default/web:p"); got != port {
		t.Fatalf("proxy port %d, want %d (the range's only port)", got, port)
	}
	if n := failedSyncs(); n != 0 {
		t.Fatalf("a sync that succeeded left %d failed syncs counted", n)
	}
}

// A portal write iptables refused is retried after 1 s, then 2 s, with no
// Service change and long before the sync period.
func TestPortalFailureIsRetried(t *testing.T) {
	fake := iptables.NewFakeRunner(iptables.IPv4)
	rules := iptables.New(fake, iptables.Config{Family: iptables.IPv4, BindAddress: mustAddr("127.0.0.1"), NodeIP: mustAddr("127.0.0.1")})
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p := New(Options{IPv4Portals: rules, BindAddress: mustAddr("127.0.0.1"), Clock: clk, MinSyncPeriod: time.Second, SyncPeriod: time.Hour})
	runInBackground(t, p.Run)
	written := func() bool { return strings.Contains(natRules(fake), "default/web:p") }

	fake.SetError("Restore", errors.New("iptables-restore: line 3 failed"))
	p.OnServiceAdd(makeService("web")) // before the sources' sync: one trigger
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	waitFor(t, "the first sync to fail", func() bool {
		p.syncMu.Lock()
		defer p.syncMu.Unlock()
		return p.failedSyncs == 1
	})
	waitFor(t, "retry armed", func() bool { return clk.Waiters() == 3 })
	if written() {
		t.Fatal("rules written although every restore fails")
	}
	// Still failing: the next retry waits 2 s (it used to come every
	// min-sync-period for as long as the write failed).
	clk.Step(time.Second)
	waitFor(t, "the first retry to fail", func() bool {
		p.syncMu.Lock()
		defer p.syncMu.Unlock()
		return p.failedSyncs == 2
	})
	waitFor(t, "retry armed", func() bool { return clk.Waiters() == 3 })
	restores := fake.CallsOf("Restore")
	clk.Step(time.Second)
	time.Sleep(20 * time.Millisecond)
	if n := fake.CallsOf("Restore"); n != restores {
		t.Fatalf("retried 1 s after the second failure (%d restores, had %d), not 2 s", n, restores)
	}
	fake.SetError("Restore", nil)
	clk.Step(time.Second)
	waitFor(t, "the rules written by the retry", written)
}

// The backoff grows while the same things keep failing and starts over at
// the short wait when something fails that did not fail the sync before.
// Each step runs when the retry before it was due.
func TestRetryStartsOverOnANewFailure(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p := New(Options{BindAddress: mustAddr("127.0.0.1"), Clock: clk, MinSyncPeriod: time.Second, SyncPeriod: 30 * time.Second})
	for _, step := range []struct {
		failed []string
		want   time.Duration // 0: no retry
	}{
		{[]string{"open default/a:p"}, time.Second},
		{[]string{"open default/a:p"}, 2 * time.Second},
		{[]string{"open default/a:p"}, 4 * time.Second},
		{[]string{"portals", "open default/a:p"}, time.Second}, // the rule write is new
		{[]string{"open default/a:p", "portals"}, 2 * time.Second},
		{[]string{"open default/a:p"}, 4 * time.Second}, // fewer failures: nothing new
		{nil, 0},
		{[]string{"open default/a:p"}, time.Second},
	} {
		p.runner.retry = 0
		p.retryFailures(step.failed)
		if got := p.runner.retry; got != step.want {
			t.Fatalf("after %q: retry in %v, want %v", step.failed, got, step.want)
		}
		clk.Step(max(step.want, time.Second))
	}
}

// Syncs that come between the retries (Service changes, each of which
// retries the same work) do not stretch the wait: it counts the time the
// work has been failing. Counting syncs, five manifest edits in half a
// second put the next retry of a port that could not open 16 s away, 32 s
// with one more edit: past the sync period.
func TestRetryWaitCountsTimeNotSyncs(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p := New(Options{BindAddress: mustAddr("127.0.0.1"), Clock: clk, MinSyncPeriod: time.Second, SyncPeriod: time.Minute})
	failed := []string{"open default/a:p"}
	for range 6 {
		p.runner.retry = 0
		p.retryFailures(slices.Clone(failed))
		clk.Step(100 * time.Millisecond)
	}
	if got, want := p.runner.retry, 1500*time.Millisecond; got != want {
		t.Errorf("after six failing syncs in half a second: retry in %v, want %v (1 s plus the 0.5 s it has been failing)", got, want)
	}
}

// TestOpenFailureLeavesNoBalancerEntry: a port whose socket could not open
// (the only port of the range held by someone else) and whose Service then
// went away leaves nothing in the balancer: its entry, with the affinity
// table and metric series, stayed for the life of the process.
func TestOpenFailureLeavesNoBalancerEntry(t *testing.T) {
	holder, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	p := newTestProxier(t, Options{PortRange: PortRange{Base: holder.Addr().(*net.TCPAddr).Port, Size: 1}})
	svc := makeService("web", withClientIPAffinity(100))
	es := makeSlice("web", v1.ProtocolTCP, "10.0.0.1:80")
	p.OnServiceAdd(svc)
	p.OnEndpointSliceAdd(es)
	p.Sync()
	p.OnServiceDelete(svc)
	p.OnEndpointSliceDelete(es)
	p.Sync()
	if names := p.lb.ServicePortNames(); len(names) != 0 {
		t.Errorf("balancer entries after the Service and its slices are gone: %v", names)
	}
}

// /debug/services lists a wanted service port whose socket did not open,
// with no proxy address and the error, until it opens or goes: it was
// missing from the list, its only trace a log line (black-box audit).
func TestOpenFailureIsListed(t *testing.T) {
	holder, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := holder.Addr().(*net.TCPAddr).Port
	p := newTestProxier(t, Options{PortRange: PortRange{Base: port, Size: 1}})
	svc := makeService("web")
	p.OnServiceAdd(svc)
	p.Sync()
	rows := p.DebugServices()
	if len(rows) != 1 || rows[0].ProxyAddress != "" || rows[0].Error == "" || rows[0].ServicePort != "default/web:p" {
		t.Fatalf("rows while the port is taken: %+v, want default/web:p with an error and no proxy address", rows)
	}
	// faultsEnabled is false only while the fault API holds a port down,
	// which nothing did here: it read false, the field's zero value.
	if !rows[0].FaultsEnabled {
		t.Errorf("faultsEnabled false on a port the fault API never disabled: %+v", rows[0])
	}
	// The metric an alert can watch: the sync timestamp and /healthz
	// follow the rules, which a port that cannot open does not stop.
	if got := testutil.ToFloat64(p.metrics.ServicePortsUnserved); got != 1 {
		t.Errorf("service_ports_unserved %v while the port is taken, want 1", got)
	}
	holder.Close()
	p.Sync()
	rows = p.DebugServices()
	if len(rows) != 1 || rows[0].Error != "" || !strings.HasSuffix(rows[0].ProxyAddress, ":"+strconv.Itoa(port)) {
		t.Fatalf("rows once the port is free: %+v", rows)
	}
	if got := testutil.ToFloat64(p.metrics.ServicePortsUnserved); got != 0 {
		t.Errorf("service_ports_unserved %v once the port opened, want 0", got)
	}
	p.OnServiceDelete(svc)
	p.Sync()
	if rows := p.DebugServices(); len(rows) != 0 {
		t.Fatalf("rows after the Service is gone: %+v", rows)
	}
}

// A service port whose second socket (a Local traffic policy's) cannot
// open is listed with its proxy address and the reason in error, until it
// opens or is no longer needed: listed with no error and no
// externalProxyAddress, it read as served while its external addresses
// had no portal (externalTrafficPolicy Local alone), the reason only in a
// log line.
func TestExternalOpenFailureIsListed(t *testing.T) {
	base := freeTCPPorts(t, 2)
	p := newTestProxier(t, Options{PortRange: PortRange{Base: base, Size: 2}})
	policy := func(local bool) *v1.Service {
		return makeService("web", withNodePort(30080), func(s *v1.Service) {
			if local {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}
		})
	}
	old := policy(false)
	p.OnServiceAdd(old)
	p.Sync()
	port, ok := p.ProxyPort("default/web:p")
	if !ok {
		t.Fatalf("web has no proxy socket (left undone: %q)", p.lastFailed)
	}
	// The range's other port is held by another process.
	other := base
	if port == base {
		other = base + 1
	}
	holder, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(other))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	row := func(what string) DebugServicePort {
		t.Helper()
		rows := p.DebugServices()
		if len(rows) != 1 || !strings.HasSuffix(rows[0].ProxyAddress, ":"+strconv.Itoa(port)) {
			t.Fatalf("%s: rows %+v, want default/web:p on %d", what, rows, port)
		}
		return rows[0]
	}
	change := func(svc *v1.Service) {
		p.OnServiceUpdate(old, svc)
		old = svc
		p.Sync()
	}
	change(policy(true))
	if r := row("second socket's port taken"); r.ExternalProxyAddress != "" || !strings.Contains(r.Error, "second proxy socket") {
		t.Errorf("second socket's port taken: externalProxyAddress %q, error %q; want none, and why", r.ExternalProxyAddress, r.Error)
	}
	change(policy(false))
	if r := row("policy back to Cluster"); r.Error != "" {
		t.Errorf("policy back to Cluster (no second socket needed): error %q", r.Error)
	}
	change(policy(true))
	if r := row("Local again"); !strings.Contains(r.Error, "second proxy socket") {
		t.Errorf("Local again, its port still taken: error %q, want why", r.Error)
	}
	holder.Close()
	p.Sync() // the retry
	if r := row("port free"); r.Error != "" || !strings.HasSuffix(r.ExternalProxyAddress, ":"+strconv.Itoa(other)) {
		t.Errorf("once the port is free: externalProxyAddress %q, error %q; want :%d and none", r.ExternalProxyAddress, r.Error, other)
	}
}

// shortDialer fails every dial as a node out of descriptors does.
type shortDialer struct{ dials atomic.Int32 }

func (d *shortDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	d.dials.Add(1)
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
}

// A dial that fails for want of descriptors on this node is not an
// endpoint's failure: the client is refused at once, no other endpoint is
// tried or counted as failing, and a ClientIP client keeps its endpoint.
// Before, every endpoint was tried, counted and the client re-pinned.
func TestLocalShortageIsNoEndpointFailure(t *testing.T) {
	d := &shortDialer{}
	p := newTestProxier(t, Options{Dialer: d})
	p.OnServiceAdd(makeService("web", withClientIPAffinity(100)))
	p.OnEndpointSliceAdd(makeSlice("web", v1.ProtocolTCP, "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"))
	p.Sync()
	name := p.lbName("default/web:p")
	pinned, err := p.lb.ServicePort(name).Next(netip.MustParseAddr("127.0.0.1"), false)
	if err != nil {
		t.Fatal(err)
	}
	// The reset can beat the client's connect: refused either way.
	if c, err := net.DialTimeout("tcp", proxyAddr(t, p, "default/web:p"), 2*time.Second); err == nil {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("the client was served")
		}
		c.Close()
	}
	waitFor(t, "the dial", func() bool { return d.dials.Load() > 0 })
	time.Sleep(50 * time.Millisecond) // any further dial would have come by now
	if n := d.dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1: another endpoint would fail alike", n)
	}
	m := p.metrics.ports.lookup("default/web:p")
	if f, r := m.dialFailures.value(), m.dialRetries.value(); f != 0 || r != 0 {
		t.Errorf("dial failures %v, retries %v; want 0 and 0", f, r)
	}
	if again, _ := p.lb.ServicePort(name).Next(netip.MustParseAddr("127.0.0.1"), false); again != pinned {
		t.Errorf("the client's affinity moved from %v to %v", pinned, again)
	}
}
