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
	p         view
	cn        clientNet
	backends  []*backend.Server
	manifests *manifestDir
	// viaClusterIP: clients connect to the Services' ClusterIPs, which
	// iptables portals send to the proxy sockets (demo --netns); otherwise
	// they connect to the proxy sockets themselves.
	viaClusterIP bool
	// socketHost is where a proxy socket on the wildcard address is reached.
	socketHost netip.Addr
	// clientWhere says where the clients run, for the packet path ("": this
	// machine).
	clientWhere string
}

// view is how the demo sees the proxier: what /debug/services shows.
// *proxier.Proxier is one; demo --netns reads the endpoint over HTTP.
type view interface {
	DebugServices() []proxier.DebugServicePort
	ProxyPort(servicePort string) (int, bool)
}

func (l *lab) addr(c client) netip.Addr { return l.cn.addr(c) }

// access makes one HTTP request from client c to servicePort's address and
// returns the backend's name.
func (l *lab) access(ctx context.Context, to netip.AddrPort, c client) (string, error) {
	return accessTCP(ctx, l.cn, to, l.addr(c))
}

// accessMany makes n sequential requests from c.
func (l *lab) accessMany(ctx context.Context, to netip.AddrPort, c client, n int) ([]string, error) {
	return accessMany(ctx, l.cn, to, l.addr(c), n)
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

// proxyAddr is where clients connect to reach servicePort: its proxy
// socket (--bind-address 127.0.0.1), or with portals its ClusterIP.
func (l *lab) proxyAddr(servicePort string) (netip.AddrPort, error) {
	if l.viaClusterIP {
		return l.clusterAddr(servicePort)
	}
	return l.socketAddr(servicePort)
}

// socketAddr is servicePort's proxy socket.
func (l *lab) socketAddr(servicePort string) (netip.AddrPort, error) {
	s, ok := l.service(servicePort)
	if !ok || s.ProxyAddress == "" {
		return netip.AddrPort{}, fmt.Errorf("%s has no proxy socket", servicePort)
	}
	a, err := netip.ParseAddrPort(s.ProxyAddress)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%s: proxy address: %w", servicePort, err)
	}
	if a.Addr().IsUnspecified() && l.socketHost.IsValid() {
		// A socket on 0.0.0.0 is reached on any local address; the portal
		// DNATs to this one.
		a = netip.AddrPortFrom(l.socketHost, a.Port())
	}
	return a, nil
}

// clusterAddr is servicePort's ClusterIP and port.
func (l *lab) clusterAddr(servicePort string) (netip.AddrPort, error) {
	s, ok := l.service(servicePort)
	if !ok || len(s.ServiceIPs) == 0 {
		return netip.AddrPort{}, fmt.Errorf("%s has no ClusterIP", servicePort)
	}
	ip, err := netip.ParseAddr(s.ServiceIPs[0])
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%s: ClusterIP: %w", servicePort, err)
	}
	return netip.AddrPortFrom(ip, uint16(s.Port)), nil
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
func (l *lab) pinnedTo(servicePort string, who client) (string, bool) {
	s, _ := l.service(servicePort)
	for _, c := range s.Clients {
		if c.ClientIP == l.addr(who).String() {
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
	_, err := l.waitFor(ctx, "proxy sockets with 3 endpoints each", l.ready)
	return err
}

// ready: every demo service port has a socket and all three backends.
func (l *lab) ready() bool {
	for _, sp := range []string{webServicePort, stickyServicePort, echoServicePort} {
		if _, ok := l.p.ProxyPort(sp); !ok || len(l.endpointNames(sp)) != len(l.backends) {
			return false
		}
	}
	return true
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
