package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// TestCleanupBesideARunningProxy: --cleanup run while a proxy runs (the
// DaemonSet not stopped first) removes every rule, and the proxy put them
// back only at its next full sync: every Service was refused until then
// (377 of 3,853 connections at 100/s, by hand; up to the whole
// --iptables-sync-period). The proxy now puts them back as soon as the
// cleanup ends. The sync period here is an hour, so only that can.
func TestCleanupBesideARunningProxy(t *testing.T) {
	requireSuite(t)
	c := netns.NewCluster(t, netns.ClusterOptions{Backends: 2, ClientIPsEach: 1})
	c.StartBackends(t, backendBin, backendPort)
	p := newProxy(t, c, "--iptables-sync-period", "1h")
	s := svc{name: "web", clusterIP: "10.96.0.10", endpoints: ips(c, 0, 1)}
	writeSvc(t, p.dir, s)
	p.Start(t, startWithin)
	e := &env{c: c}
	e.pod1(0).WaitServed(t, "tcp", s.tcp(), time.Now(), startBudget)

	out, err := p.Cleanup()
	if err != nil {
		t.Fatalf("--cleanup beside the running proxy: %v\n%s", err, out)
	}
	if !strings.Contains(out, "is running in this network namespace") {
		t.Errorf("--cleanup beside the running proxy did not warn of it:\n%s", out)
	}
	cleaned := time.Now()
	took := e.pod1(0).WaitServed(t, "tcp", s.tcp(), cleaned, 5*time.Second)
	if len(p.LogLines("--cleanup that found this one ended")) == 0 {
		t.Errorf("the proxy did not say why it put the rules back:\n%s", p.Proc.Output())
	}
	figure(t, "--cleanup beside a running proxy: served again %d ms after the cleanup ended", took.Milliseconds())
}
