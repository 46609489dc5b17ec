package main

import (
	"context"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

func TestRunDemoRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--no-such-flag"}, {"extra"}} {
		if code := runDemo(args); code != exitUsage {
			t.Errorf("runDemo(%q) = %d, want %d", args, code, exitUsage)
		}
	}
}

// TestStartForDemo checks the command's side of the demo: the demo's kind
// of command line is parsed and validated by the command's flag set and
// run by its wiring, which reports the proxier and the metrics address.
// (Package demo's own tests run the experiments.)
func TestStartForDemo(t *testing.T) {
	if err := startForDemo(t.Context(), []string{"--no-such-flag"}, nil); err == nil || !strings.Contains(err.Error(), "demo flags") {
		t.Errorf("bad flag: err %v, want a demo flags error", err)
	}
	args := []string{"--manifests", t.TempDir(), "--iptables=false", "--bind-address", "127.0.0.1",
		"--metrics-bind-address", "127.0.0.1:0", "--healthz-bind-address", ""}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	started := make(chan string, 1)
	go func() {
		done <- startForDemo(ctx, args, func(p *proxier.Proxier, metricsAddr string) { started <- metricsAddr })
	}()
	select {
	case addr := <-started:
		if !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Errorf("metrics address %q, want one on 127.0.0.1", addr)
		}
	case err := <-done:
		t.Fatalf("returned before starting: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("after cancel: %v", err)
	}
}

// The demo's help says what it runs: its fault step uses annotations, not
// the live fault API (the help promised "the fault API", which no demo
// mode starts).
func TestDemoHelpSaysWhatItRuns(t *testing.T) {
	var code int
	out := captureStdout(t, func() { code = runDemo([]string{"--help"}) })
	if code != 0 {
		t.Fatalf("demo --help exited %d", code)
	}
	if strings.Contains(out, "the fault API)") || !strings.Contains(out, "annotation") {
		t.Errorf("demo --help:\n%s", out)
	}
}
