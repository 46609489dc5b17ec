package demo

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// Starter runs the proxier with args, a command line of kube-userspace-proxy,
// calls started once the proxier exists and returns when ctx ends. The
// command's wiring lives in package main, which no package can import, so
// the command hands it in.
type Starter func(ctx context.Context, args []string, started func(p *proxier.Proxier, metricsAddr string)) error

// Options are the demo's choices.
type Options struct {
	// Serve keeps the example up after the experiments until ctx ends.
	Serve bool
	// Width is what tables and pictures fit in (0: DefaultWidth).
	Width int
}

// Run runs the whole demonstration, writing to out, and reports whether
// every outcome matched the real cluster and every fault behaved as
// expected. An error means it could not run (or was interrupted), not that
// an experiment failed. With opt.Serve it returns only when ctx ends. start
// runs the proxier; the command passes its own flag parsing and wiring so
// that the demo exercises what the binary runs.
func Run(ctx context.Context, out io.Writer, opt Options, start Starter) (bool, error) {
	if opt.Width <= 0 {
		opt.Width = DefaultWidth
	}
	backends, err := startBackends("backend-a", "backend-b", "backend-c")
	if err != nil {
		return false, err
	}
	defer stopBackends(backends)
	m, err := newManifestDir(backends)
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(m.dir)
	dir := m.dir

	args := proxierArgs(dir)
	px, err := startProxier(ctx, start, args)
	if err != nil {
		return false, err
	}
	defer px.stop()

	l := &lab{p: px.p, cn: loopback{}, backends: backends, manifests: m}
	if err := l.waitReady(ctx); err != nil {
		return false, err
	}
	l.intro(out, opt.Width, args, onLoopback)
	matched, err := l.run(ctx, out, opt.Width, nil)
	if err != nil {
		return false, err
	}
	if opt.Serve {
		if err := l.serve(ctx, out, opt.Width, px.metricsAddr); err != nil && ctx.Err() == nil {
			return matched, err
		}
		return matched, nil
	}
	// Everything goes when Run returns: say where Services stay up to be
	// tried, and where the proxy on one's own manifests is described.
	fmt.Fprintln(out)
	paragraph(out, opt.Width, `Next: kube-userspace-proxy demo --serve (make serve) runs the demo again and keeps its Services up, with the commands to reach them; as root, demo --netns runs it through real iptables rules. To run the proxy on manifests of your own, see README.md, "Running it".`)
	return matched, nil
}

// run prints the packet path, runs the affinity experiments and the fault
// section and prints their tables. rule finds a ClusterIP's portal rule
// (nil: no portals).
func (l *lab) run(ctx context.Context, out io.Writer, width int, rule func(netip.AddrPort) string) (bool, error) {
	path, err := l.tracePath(ctx, rule)
	if err != nil {
		return false, fmt.Errorf("the first request: %w", err)
	}
	fmt.Fprintln(out, "The path of one request of this run, from client 1 to the Service default/web:")
	fmt.Fprintln(out)
	path.render(out, width)
	fmt.Fprint(out, `
Session affinity. A Service's sessionAffinity "None" lets each new connection
go to any of its pods; "ClientIP" keeps each client (by IP address) on one pod
until it has been quiet for timeoutSeconds. A real cluster (kube-proxy in
iptables mode) was measured once with the experiments below; what it did is in
the second column, what this proxy does in the third.

`)
	t := newTable(out, width, "experiment", "real cluster (kube-proxy)", "this proxy", "same?")
	t.start("Running 9 experiments (about 15 s)")
	if err := l.experiments(ctx, t); err != nil {
		t.interrupted()
		return false, err
	}
	matched := t.footer()
	faultsOK, err := l.faultSection(ctx, out, width)
	if err != nil {
		return false, err
	}
	return matched && faultsOK, nil
}

// experiments runs the affinity experiments in the real cluster's order,
// adding a row per outcome; it stops early only when ctx ends.
func (l *lab) experiments(ctx context.Context, t *table) error {
	t.add(l.plainDistribution(ctx))
	r1, b1 := l.stickyDistribution(ctx, "client 1", "30/30 on one pod", cli1)
	t.add(r1)
	r2, b2 := l.stickyDistribution(ctx, "client 2", "30/30 on one pod, client 1 on another", cli2)
	if r2.Matched {
		r2.Ours = fmt.Sprintf("30/30 on %s, client 1 on %s", b2, b1)
		r2.Matched = r1.Matched // "independently pinned" needs both pins
	}
	t.add(r2)
	if err := ctx.Err(); err != nil {
		return err
	}

	reload := row{Experiment: "affinity timeout set to 3 s by editing the manifest", Expected: "in force"}
	if took, err := l.setStickyTimeout(ctx, 3); err != nil {
		reload.Ours = "error: " + err.Error()
	} else {
		reload.Ours = fmt.Sprintf("in force after %s", round(took))
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
