package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/demo"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// demoRunNetNS is demo --netns (a test's stand-in replaces it).
var demoRunNetNS = demo.RunNetNS

// runDemo is the demo subcommand (package demo says what it shows). Exit
// status: 0 when every outcome matched, 1 otherwise, 2 for bad
// flags, 130 when interrupted (Ctrl-C) before the experiments were done.
func runDemo(args []string) int {
	fs := pflag.NewFlagSet("kube-userspace-proxy demo", pflag.ContinueOnError)
	serve := fs.Bool("serve", false, "After the experiments, keep serving the example Services on loopback until Ctrl-C.")
	verbose := fs.Bool("verbose", false, "Show the proxier's own log on stderr.")
	netns := fs.Bool("netns", false, "As root: run the experiments through real iptables portals, with the proxy as a process in a throw-away network namespace and the clients in another; print the rules it installed and the conntrack entries the traffic left. Everything is removed at the end, also on Ctrl-C.")
	fs.Usage = func() {
		fmt.Fprintf(os.Stdout, "Usage: kube-userspace-proxy demo [--serve] [--verbose]\n       kube-userspace-proxy demo --netns [--verbose]   (as root)\n\n"+
			"Runs the session-affinity experiments of a real cluster against this proxy, then\n"+
			"its fault injection (latency and connection resets declared in a Service\n"+
			"annotation), on loopback, without a cluster or root; the live fault API is not\n"+
			"part of it (README: Fault injection). Exit status 0 when every outcome matched.\n\nFlags:\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy demo: %v\n", flagSuggestion(err, fs))
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, unexpectedArguments("kube-userspace-proxy demo", args, fs, ""))
		return exitUsage
	}
	if *netns && *serve {
		fmt.Fprintln(os.Stderr, "kube-userspace-proxy demo: --serve and --netns do not go together (the namespaces are removed at the end)")
		return exitUsage
	}
	if !*verbose {
		// The table is the output; the proxier's info log would drown it.
		// Errors still reach stderr (klog's stderrthreshold).
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals()...)
	defer stop()
	opt := demo.Options{Serve: *serve, Width: outputWidth(os.Stdout)}
	var matched bool
	var err error
	if *netns {
		// The proxy runs as this same binary, in the node namespace.
		var exe string
		if exe, err = os.Executable(); err == nil {
			matched, err = demoRunNetNS(ctx, os.Stdout, opt, demo.Command{Path: exe})
		}
	} else {
		matched, err = demo.Run(ctx, os.Stdout, opt, startForDemo)
	}
	if err != nil && ctx.Err() != nil {
		// Ctrl-C (SIGTERM, SIGHUP) before the experiments were done: an
		// interruption, as explain says one, not the demo failing with
		// "context canceled" (`make demo`/`make serve` then said Error 1).
		fmt.Fprintln(os.Stderr, "kube-userspace-proxy demo: interrupted before the experiments were done")
		// Namespaces it could not remove are left on the machine: said,
		// with how to remove them (the interruption's line alone hid it).
		if ce := (*demo.CleanupError)(nil); errors.As(err, &ce) {
			fmt.Fprintf(os.Stderr, "kube-userspace-proxy demo: %s\n", ce.CleanupMessage())
		}
		return exitInterrupted
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy demo: %v\n", err)
		return 1
	}
	if !matched {
		return 1
	}
	return 0
}

// outputWidth is what the demo's tables fit in: the terminal's width when
// out is one and narrower than demo.DefaultWidth, else $COLUMNS when set
// and narrower, else demo.DefaultWidth.
func outputWidth(out *os.File) int {
	width := demo.DefaultWidth
	if ws, err := unix.IoctlGetWinsize(int(out.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
		width = min(width, int(ws.Col))
	} else if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 0 {
		width = min(width, c)
	}
	return max(width, 60)
}

// startForDemo runs the proxier on the demo's command line with the
// command's own flag set, validation and wiring.
func startForDemo(ctx context.Context, args []string, onStart func(*proxier.Proxier, string)) error {
	o := newOptions()
	fs := pflag.NewFlagSet("kube-userspace-proxy", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("demo flags: %w", err)
	}
	v, err := o.validate()
	if err != nil {
		return fmt.Errorf("demo flags: %w", err)
	}
	return run(ctx, o, v, onStart)
}
