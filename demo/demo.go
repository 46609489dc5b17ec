package demo

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// Starter runs the proxier with args, a command line of kube-userspace-proxy,
// calls started once the proxier exists and returns when ctx ends. The
// command's wiring lives in package main, which no package can import, so
// the command hands it in.
type Starter func(ctx context.Context, args []string, started func(p *proxier.Proxier, metricsAddr string)) error

// Run runs the whole demonstration, writing to out, and reports whether
// every outcome matched the seed and every fault behaved as expected. An
// error means it could not run (or was interrupted), not that an
// experiment failed. With serve it returns only
// when ctx ends. start runs the proxier; the command passes its own flag
// parsing and wiring so that the demo exercises what the binary runs.
func Run(ctx context.Context, out io.Writer, serve bool, start Starter) (bool, error) {
	backends, err := startBackends("backend-a", "backend-b", "backend-c")
	if err != nil {
		return false, err
	}
	defer stopBackends(backends)

	dir, err := os.MkdirTemp("", "kube-userspace-proxy-demo-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	m := &manifestDir{dir: dir, backends: backends}
	if err := m.writeAll(); err != nil {
		return false, err
	}

	args := proxierArgs(dir)
	px, err := startProxier(ctx, start, args)
	if err != nil {
		return false, err
	}
	defer px.stop()

	l := &lab{p: px.p, backends: backends, manifests: m}
	if err := l.waitReady(ctx); err != nil {
		return false, err
	}
	l.intro(out, args)

	t := &table{w: out}
	t.header()
	if err := l.experiments(ctx, t); err != nil {
		return false, err
	}
	matched := t.footer()
	faultsOK, err := l.faultSection(ctx, out)
	if err != nil {
		return false, err
	}
	matched = matched && faultsOK
	if serve {
		if err := l.serve(ctx, out, px.metricsAddr); err != nil && ctx.Err() == nil {
			return matched, err
		}
	}
	return matched, nil
}

// experiments runs seed 000's experiments in the seed's order, adding a
// row per outcome; it stops early only when ctx ends.
func (l *lab) experiments(ctx context.Context, t *table) error {
	t.add(l.plainDistribution(ctx))
	r1, b1 := l.stickyDistribution(ctx, "cli1", "30/30 on one backend", cli1)
	t.add(r1)
	r2, b2 := l.stickyDistribution(ctx, "cli2", "30/30 on 44wps; cli1 on wgtmr", cli2)
	if r2.Matched {
		r2.Ours = fmt.Sprintf("30/30 on %s; cli1 on %s", b2, b1)
		r2.Matched = r1.Matched // "independently pinned" needs both pins
	}
	t.add(r2)
	if err := ctx.Err(); err != nil {
		return err
	}

	reload := row{Experiment: "timeoutSeconds 3 by rewriting the manifest", Seed: "rules' --seconds becomes 3"}
	if took, err := l.setStickyTimeout(ctx, 3); err != nil {
		reload.Ours = "error: " + err.Error()
	} else {
		reload.Ours = fmt.Sprintf("timeout 3 s applied after %s", round(took))
		reload.Matched = true
	}
	t.add(reload)
	if err := ctx.Err(); err != nil {
		return err
	}

	t.add(l.timeoutTrials(ctx).rows()...)
	if err := ctx.Err(); err != nil {
		return err
	}

	r, notes := l.pinnedBackendDeleted(ctx)
	t.add(r)
	t.note(notes...)
	if err := ctx.Err(); err != nil {
		return err
	}

	t.add(l.udpSessions())
	return ctx.Err()
}

// proxierArgs is the proxier's command line in the demo: the manifests
// directory, no iptables (no root), sockets and metrics on loopback only.
func proxierArgs(dir string) []string {
	return []string{
		"--manifests", dir,
		"--iptables=false",
		"--bind-address", bindAddr.String(),
		"--metrics-bind-address", "127.0.0.1:0",
		"--healthz-bind-address", "",
	}
}

// shellJoin renders args as a command line a user could paste.
func shellJoin(args []string) string {
	parts := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'$") {
			a = fmt.Sprintf("%q", a)
		}
		parts[i] = a
	}
	return strings.Join(parts, " ")
}
