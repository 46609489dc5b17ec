package demo

import (
	"context"
	"errors"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// runningProxier is the real proxier, run in-process by the command's wiring
// exactly as the command line would run it.
type runningProxier struct {
	p           *proxier.Proxier
	metricsAddr string
	cancel      context.CancelFunc
	done        chan error
}

// startProxier runs start on args and returns once the proxier exists.
func startProxier(ctx context.Context, start Starter, args []string) (*runningProxier, error) {
	ctx, cancel := context.WithCancel(ctx)
	d := &runningProxier{cancel: cancel, done: make(chan error, 1)}
	up := make(chan struct{})
	go func() {
		d.done <- start(ctx, args, func(p *proxier.Proxier, metricsAddr string) {
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

// stop ends the run and waits until every proxy socket is closed.
func (d *runningProxier) stop() error {
	d.cancel()
	return <-d.done
}
