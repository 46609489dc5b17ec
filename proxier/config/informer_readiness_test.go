package config

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A check whose context ends returns then, not when a probe into a path
// that drops packets times out (2 s): a stop during an outage waited for it.
// The probe still ends for those that joined it, with its own answer.
func TestReadinessCheckEndsWithItsContext(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var probes atomic.Int32
	r := newReadiness(func(context.Context) bool {
		probes.Add(1)
		<-release
		return true
	})
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan bool, 1)
	go func() { first <- r.now(ctx) }()
	joined := make(chan bool, 1)
	go func() {
		for probes.Load() == 0 { // the first check's probe is under way
			time.Sleep(time.Millisecond)
		}
		joined <- r.now(context.Background())
	}()
	for probes.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case ready := <-first:
		if ready {
			t.Error("a check whose context ended said ready")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a check whose context ended still waits for its probe after 5 s")
	}
	release <- struct{}{}
	select {
	case ready := <-joined:
		if !ready {
			t.Error("the check that joined the probe was told not ready; the probe said ready")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the check that joined the probe not answered")
	}
	if n := probes.Load(); n != 1 {
		t.Errorf("%d probes for two checks made while one was under way, want 1", n)
	}
}
