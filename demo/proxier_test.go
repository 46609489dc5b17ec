package demo

import (
	"context"
	"errors"
	"net/http/httptest"
	"net/netip"

	"github.com/spf13/pflag"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// startInProcess stands in for the command's wiring, which package main
// keeps and tests cannot import: the manifests source feeding a proxier
// with its defaults (the flags' defaults) and no rules, plus the debug view
// for the address the demo prints. It accepts exactly the flags the demo
// passes, so a change to them shows up here.
func startInProcess(ctx context.Context, args []string, started func(*proxier.Proxier, string)) error {
	fs := pflag.NewFlagSet("demo test", pflag.ContinueOnError)
	manifests := fs.String("manifests", "", "")
	bind := fs.String("bind-address", "", "")
	iptables := fs.Bool("iptables", true, "")
	fs.String("metrics-bind-address", "", "")
	fs.String("healthz-bind-address", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *iptables {
		return errors.New("the demo must run without iptables")
	}
	bindAddr, err := netip.ParseAddr(*bind)
	if err != nil {
		return err
	}
	p := proxier.New(proxier.Options{BindAddress: bindAddr})
	debug := httptest.NewServer(p.DebugHandler())
	defer debug.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srcErr := make(chan error, 1)
	go func() { srcErr <- config.NewManifestSource(*manifests, p).Run(ctx) }()
	proxierDone := make(chan struct{})
	go func() {
		p.Run(ctx)
		close(proxierDone)
	}()
	started(p, debug.Listener.Addr().String())
	select {
	case err = <-srcErr:
		if errors.Is(err, context.Canceled) {
			err = nil
		}
	case <-ctx.Done():
	}
	cancel()
	<-proxierDone
	return err
}
