package e2ecp

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
)

const (
	// outage is how long kube-apiserver stays down.
	outage = 30 * time.Second
	// outageProbeEvery spaces the checks that existing Services still answer.
	outageProbeEvery = 5 * time.Second
	// resyncBudget bounds how soon after kube-apiserver is ready again the proxy serves
	// what changed. client-go's reflectors alone (v0.37.2, backoff 800 ms doubling to a
	// 30 s cap, each delay stretched by up to 2x) took 45-56 s here; the proxy's informers
	// wait for /readyz instead (proxier/config.patientListWatch), probed at jittered
	// waits that double from 250 ms to 2-3 s, so a change is served within about 3 s
	// after a long outage (0.4 s after a short one). The figure is logged.
	resyncBudget = 5 * time.Second
	// healthzEvery spaces the /healthz probes across the outage.
	healthzEvery = 500 * time.Millisecond
)

// healthzWatch probes the proxy's /healthz until stopped and keeps what was not 200.
type healthzWatch struct {
	stop   chan struct{}
	done   sync.WaitGroup
	mu     sync.Mutex
	probes int
	bad    []string
}

func watchHealthz(p *harness.Proxy, began time.Time) *healthzWatch {
	w := &healthzWatch{stop: make(chan struct{})}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		tick := time.NewTicker(healthzEvery)
		defer tick.Stop()
		for {
			code, body, err := p.Healthz()
			if err != nil {
				// A probe that got no answer within its 1 s is asked again
				// at once, as kubelet's failureThreshold (3) would: on a
				// loaded 2-core runner with -race one GET once took longer
				// while the proxy answered 200 before and after. A status
				// other than 200 counts at once.
				code, body, err = p.Healthz()
			}
			w.mu.Lock()
			w.probes++
			if err != nil || code != http.StatusOK {
				w.bad = append(w.bad, fmt.Sprintf("at %v: %d %s %v", time.Since(began).Round(time.Millisecond), code, body, err))
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// finish stops the probes and returns how many ran and those that were not 200.
func (w *healthzWatch) finish() (int, []string) {
	close(w.stop)
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.probes, w.bad
}

// checkAPIServerOutage stops kube-apiserver for 30 s (etcd keeps running). Existing
// Services must keep answering throughout and /healthz must stay 200 (nothing is queued,
// so nothing is late); once kube-apiserver is back, the proxy must resync: serve a
// Service created after the restart and follow an endpoint change of an existing one.
func checkAPIServerOutage(t *testing.T, e *env) {
	ns := e.cp.Namespace(t)
	pod := e.pod(ipOutageBefore)
	before, beforeSlice := createService(t, e.admin, newService(ns, "before", 80, 53), readyEndpoints(e.backendIPs(0, 1)...))
	tcp, udp := servicePort(t, before, tcpPortName), servicePort(t, before, udpPortName)
	pod.WaitServed(t, "tcp", tcp, time.Now(), changePatience)
	pod.WaitServed(t, "udp", udp, time.Now(), changePatience)

	stopping := time.Now()
	health := watchHealthz(e.proxy, stopping)
	healthFinished := false
	defer func() {
		if !healthFinished {
			health.finish()
		}
	}()

	// The outage is counted from the moment kube-apiserver has exited: the harness waits
	// up to 10 s for a graceful exit before it kills it.
	logFrom := len(e.proxy.Lines())
	e.cp.StopAPIServer()
	began := time.Now()
	t.Logf("kube-apiserver stopped (%d ms after SIGTERM)", began.Sub(stopping).Milliseconds())
	var probes, failures []string
	for time.Since(began) < outage {
		time.Sleep(min(outageProbeEvery, outage-time.Since(began)))
		e.proxy.RequireRunning(t)
		for _, probe := range []struct {
			proto string
			dst   netip.AddrPort
		}{{"tcp", tcp}, {"udp", udp}} {
			name, err := pod.Ask(probe.proto, probe.dst, harness.AnswerTimeout)
			at := time.Since(began).Round(100 * time.Millisecond)
			if err != nil {
				failures = append(failures, fmt.Sprintf("%s %s at %v: %v", probe.proto, probe.dst, at, err))
				continue
			}
			probes = append(probes, fmt.Sprintf("%s@%v=%s", probe.proto, at, name))
		}
	}
	t.Logf("FIGURE outage: existing Service %s/%s probed %d times while kube-apiserver was down, %d failed: %s",
		ns, before.Name, len(probes)+len(failures), len(failures), strings.Join(probes, " "))
	if len(failures) > 0 {
		t.Errorf("existing Service failed during the outage:\n%s", strings.Join(failures, "\n"))
	}

	restart := time.Now()
	var err error
	e.launch.Run(func() { err = e.cp.StartAPIServer() })
	if err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}
	back := time.Now()
	// While it starts, kube-apiserver may refuse requests (403) until its RBAC cache is
	// filled; that is no lack of rights. Refusals once it is ready are.
	refusedWhileStarting := len(e.proxy.LogLines("forbidden"))
	t.Logf("kube-apiserver ready again %d ms after the restart began (down %v in all)",
		back.Sub(restart).Milliseconds(), back.Sub(began).Round(100*time.Millisecond))

	// A Service created after the restart, and a new endpoint for the one from before.
	after, _ := createService(t, e.admin, newService(ns, "after", 80, 53), readyEndpoints(e.backendIPs(2)...))
	setEndpoints(beforeSlice, readyEndpoints(e.backendIPs(3)...))
	if _, err := e.admin.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), beforeSlice, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update %s: %v", beforeSlice.Name, err)
	}
	changed := time.Now()
	newSvc := e.pod(ipOutageAfter).WaitServed(t, "tcp", servicePort(t, after, tcpPortName), changed, resyncBudget)
	s4 := e.backends[3].Name
	moved := pod.WaitFor(t, "tcp", tcp, changed, resyncBudget, "answered by "+s4,
		func(name string, err error) bool { return err == nil && name == s4 })
	n, bad := health.finish()
	healthFinished = true

	t.Logf("FIGURE outage: after kube-apiserver was ready again, the Service created then was served in %d ms and the existing one's new endpoint in %d ms",
		newSvc.Milliseconds(), moved.Milliseconds())
	t.Logf("FIGURE outage: /healthz probed %d times from the stop until the resync, %d not 200", n, len(bad))
	if len(bad) > 0 {
		t.Errorf("/healthz was not 200 during the outage:\n%s", strings.Join(bad, "\n"))
	}
	e.proxy.RequireRunning(t)
	// The informers' own account of the outage: failed lists/watches and re-populated caches.
	if lines := e.proxy.LogLinesSince(logFrom, "reflector", "watch"); len(lines) > 0 {
		t.Logf("proxy log about its informers since the stop (%d lines, last 12):\n%s", len(lines),
			strings.Join(lines[max(0, len(lines)-12):], "\n"))
	}
	if refused := e.proxy.LogLines("forbidden"); len(refused) > refusedWhileStarting {
		t.Errorf("the proxy was refused requests after kube-apiserver was ready again:\n%s",
			strings.Join(refused[refusedWhileStarting:], "\n"))
	}
}
