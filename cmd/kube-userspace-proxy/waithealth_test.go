package main

import (
	"context"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
)

// A change that comes while the proxy waits for another does not age into
// an unhealthy proxy; once the wait is over it is owed, and ages from then.
func TestHealthWhileWaiting(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	const timeout = 2 * time.Second
	health := healthcheck.NewProxierHealth(clk, timeout)
	waitOver := make(chan struct{})
	h := &healthWhileWaiting{inner: health, waitOver: waitOver}

	h.QueuedUpdate()
	clk.Step(3 * timeout)
	if ok, _ := health.Healthy(); !ok {
		t.Fatal("a change queued while waiting for another proxy made the proxy unhealthy")
	}

	close(waitOver)
	h.takeOver()
	clk.Step(timeout / 2)
	if ok, _ := health.Healthy(); !ok {
		t.Fatal("unhealthy before the health timeout from the takeover")
	}
	clk.Step(timeout)
	if ok, _ := health.Healthy(); ok {
		t.Fatal("the change held back while waiting was not owed once the wait was over: healthy without a sync")
	}
	h.Updated()
	h.QueuedUpdate() // after the wait: counted at once
	clk.Step(2 * timeout)
	if ok, _ := health.Healthy(); ok {
		t.Fatal("a change queued after the wait did not age")
	}
}

// A proxy that waited for another owes the changes held back meanwhile
// once its turn comes (awaitTurn, which run's proxier start waits on): a
// first sync that then never lands ages into a failed /livez, as any owed
// change does. A stop while waiting owes nothing.
func TestAwaitTurnOwesTheChangesHeldBack(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	const timeout = 2 * time.Second
	health := healthcheck.NewProxierHealth(clk, timeout)
	noOtherProxy := make(chan struct{})
	s := &proxyServer{noOtherProxy: noOtherProxy, waitHealth: &healthWhileWaiting{inner: health, waitOver: noOtherProxy}}

	s.waitHealth.QueuedUpdate() // a change while another proxy holds the rules
	stopped, stop := context.WithCancel(context.Background())
	stop()
	if s.awaitTurn(stopped) {
		t.Fatal("awaitTurn said the turn came; the context ended while another proxy held the rules")
	}
	clk.Step(3 * timeout)
	if ok, _ := health.Healthy(); !ok {
		t.Fatal("a change held back while waiting was owed by a proxy stopped before its turn")
	}

	close(noOtherProxy)
	if !s.awaitTurn(context.Background()) {
		t.Fatal("awaitTurn said stopped; no other proxy holds the rules")
	}
	clk.Step(timeout + time.Second)
	if ok, _ := health.Healthy(); ok {
		t.Fatal("healthy past the health timeout from the takeover with the change held back while waiting never synced: it was not owed")
	}
}
