package demo

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/backend"
)

// lab is what the experiments work with: the running proxier, the
// backends behind it and the manifest files that feed it. It looks at the
// proxier only through its public debugging view, as a user would through
// /debug/services.
type lab struct {
	p         *proxier.Proxier
	backends  []*backend.Server
	manifests *manifestDir
}

// bindAddr is the proxier's --bind-address in the demo.
var bindAddr = netip.MustParseAddr("127.0.0.1")

// waitLimit bounds every wait for the proxier to reflect a change; the
// contract is "live within 1 s", so this only trips on a real failure.
const waitLimit = 10 * time.Second

// service returns the /debug/services row of servicePort.
func (l *lab) service(servicePort string) (proxier.DebugServicePort, bool) {
	for _, s := range l.p.DebugServices() {
		if s.ServicePort == servicePort {
			return s, true
		}
	}
	return proxier.DebugServicePort{}, false
}

// proxyAddr is where servicePort is served (--bind-address 127.0.0.1).
func (l *lab) proxyAddr(servicePort string) (netip.AddrPort, error) {
	port, ok := l.p.ProxyPort(servicePort)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%s has no proxy socket", servicePort)
	}
	return netip.AddrPortFrom(bindAddr, uint16(port)), nil
}

// endpointNames lists the backends the proxier balances servicePort over.
func (l *lab) endpointNames(servicePort string) []string {
	s, ok := l.service(servicePort)
	if !ok {
		return nil
	}
	names := make([]string, 0, len(s.Endpoints))
	for _, ep := range s.Endpoints {
		names = append(names, l.nameOf(servicePort, ep))
	}
	slices.Sort(names)
	return names
}

// nameOf maps an endpoint address of servicePort to its backend's name.
func (l *lab) nameOf(servicePort, endpoint string) string {
	for _, b := range l.backends {
		addr := b.TCPAddr()
		if servicePort == echoServicePort {
			addr = b.UDPAddr()
		}
		if addr.String() == endpoint {
			return b.Name
		}
	}
	return endpoint
}

// pinnedTo is the backend the proxier's affinity table holds for client,
// if an unexpired entry exists.
func (l *lab) pinnedTo(servicePort string, client netip.Addr) (string, bool) {
	s, _ := l.service(servicePort)
	for _, c := range s.Clients {
		if c.ClientIP == client.String() {
			return l.nameOf(servicePort, c.Endpoint), true
		}
	}
	return "", false
}

// waitFor polls cond until it holds and says how long that took.
func (l *lab) waitFor(ctx context.Context, what string, cond func() bool) (time.Duration, error) {
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Since(start) > waitLimit {
			return time.Since(start), fmt.Errorf("%s: not seen after %v", what, waitLimit)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-tick.C:
		}
	}
	return time.Since(start), nil
}

// waitReady waits until every demo service port has a socket and all
// three backends.
func (l *lab) waitReady(ctx context.Context) error {
	_, err := l.waitFor(ctx, "proxy sockets with 3 endpoints each", func() bool {
		for _, sp := range []string{webServicePort, stickyServicePort, echoServicePort} {
			if _, ok := l.p.ProxyPort(sp); !ok || len(l.endpointNames(sp)) != len(l.backends) {
				return false
			}
		}
		return true
	})
	return err
}

// setStickyTimeout rewrites the sticky Service's manifest and waits until
// the balancer applies the new timeout (0: the 10800 s default).
func (l *lab) setStickyTimeout(ctx context.Context, seconds int) (time.Duration, error) {
	if err := l.manifests.setStickyTimeout(seconds); err != nil {
		return 0, err
	}
	want := seconds
	if want == 0 {
		want = 10800
	}
	return l.waitFor(ctx, fmt.Sprintf("%s timeoutSeconds %d", stickyServicePort, want), func() bool {
		s, ok := l.service(stickyServicePort)
		return ok && s.TimeoutSec == want
	})
}

// setStickyBackends rewrites the sticky Service's EndpointSlices to bs and
// waits until the proxier balances over exactly those.
func (l *lab) setStickyBackends(ctx context.Context, bs []*backend.Server) (time.Duration, error) {
	if err := l.manifests.setStickyBackends(bs); err != nil {
		return 0, err
	}
	want := make([]string, 0, len(bs))
	for _, b := range bs {
		want = append(want, b.Name)
	}
	slices.Sort(want)
	return l.waitFor(ctx, fmt.Sprintf("%s endpoints %v", stickyServicePort, want), func() bool {
		return slices.Equal(l.endpointNames(stickyServicePort), want)
	})
}
