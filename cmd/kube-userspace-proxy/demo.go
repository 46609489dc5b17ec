package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/demo"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// runDemo is the demo subcommand (package demo says what it shows). Exit
// status: 0 when every outcome matched the seed, 1 otherwise, 2 for bad
// flags.
func runDemo(args []string) int {
	fs := pflag.NewFlagSet("kube-userspace-proxy demo", pflag.ContinueOnError)
	serve := fs.Bool("serve", false, "After the experiments, keep serving the example Services on loopback until Ctrl-C.")
	verbose := fs.Bool("verbose", false, "Show the proxier's own log on stderr.")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: kube-userspace-proxy demo [--serve] [--verbose]\n\n"+
			"Runs the session-affinity experiments of a real cluster against this proxy,\n"+
			"on loopback, without a cluster or root. Exit status 0 when every outcome matched.\n\nFlags:\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy demo: %v\n", err)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy demo: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if !*verbose {
		// The table is the output; the proxier's info log would drown it.
		// Errors still reach stderr (klog's stderrthreshold).
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	matched, err := demo.Run(ctx, os.Stdout, *serve, startForDemo)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy demo: %v\n", err)
		return 1
	}
	if !matched {
		return 1
	}
	return 0
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
