package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// demoProxier is the real proxier, run in-process by run() exactly as the
// command line would run it.
type demoProxier struct {
	p           *proxier.Proxier
	metricsAddr string
	cancel      context.CancelFunc
	done        chan error
}

// startDemoProxier parses args with the command's own flag set and
// validation, starts run() and returns once the proxier exists.
func startDemoProxier(ctx context.Context, args []string) (*demoProxier, error) {
	o := newOptions()
	fs := pflag.NewFlagSet("kube-userspace-proxy", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("demo flags: %w", err)
	}
	v, err := o.validate()
	if err != nil {
		return nil, fmt.Errorf("demo flags: %w", err)
	}

	ctx, cancel := context.WithCancel(ctx)
	d := &demoProxier{cancel: cancel, done: make(chan error, 1)}
	up := make(chan struct{})
	go func() {
		d.done <- run(ctx, o, v, func(p *proxier.Proxier, metricsAddr string) {
			d.p, d.metricsAddr = p, metricsAddr
			close(up)
		})
	}()
	select {
	case <-up:
		return d, nil
	case err := <-d.done:
		cancel()
		if err == nil {
			err = errors.New("the proxier stopped before it started")
		}
		return nil, err
	}
}

// stop ends run() and waits until every proxy socket is closed.
func (d *demoProxier) stop() error {
	d.cancel()
	return <-d.done
}
