package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/httpserver"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/netaddr"
)

// ServiceHealthServer serves the healthCheckNodePort of every Service with
// externalTrafficPolicy Local: 200 while this node has a ready local
// endpoint, 503 otherwise, so cloud load balancers send traffic only to
// nodes that can serve it without leaving the node.
type ServiceHealthServer struct {
	addrs          []ListenAddr
	listen         func(network, address string) (net.Listener, error)
	limits         httpserver.Limits
	localEndpoints func(types.NamespacedName, netip.Addr) int
	proxyHealthy   func() bool

	// ListenFailed (nil: none) hears of a healthCheckNodePort that could
	// not be listened on, once per Service and port until it opens: the
	// proxy records kube-proxy's FailedToStartServiceHealthcheck event
	// with it. Each sync retries, so each retry must not be an event.
	ListenFailed func(nn types.NamespacedName, port int, err error)

	mu      sync.Mutex
	fds     Descriptors // nil: not accounted
	servers map[types.NamespacedName]*serviceServer
	failed  map[types.NamespacedName]int // the port whose failure was told
}

type serviceServer struct {
	port int
	srvs []*http.Server // one per listen address
	lns  []net.Listener // theirs, closed at once even before Serve runs
}

// NewServiceHealthServer listens where NodePorts answer, as kube-proxy's
// service health servers: a load balancer probes the node on the node
// addresses it sends NodePort traffic to. That is every address without
// nodePortAddresses (--nodeport-addresses), else the node's addresses
// inside them, resolved once here (ListenAddrs). Each server is held to
// limits; localEndpoints gives the count per Service on each request (for
// the node address the check arrived on: a dual-stack Service answers
// each family with that family's local pods, as kube-proxy's per-family
// health servers; invalid when not known), and
// proxyHealthy (nil: always) whether this proxy's syncs keep up: as
// kube-proxy's, a node whose rules lag fails every Service's check, so
// load balancers stop sending to it.
func NewServiceHealthServer(nodePortAddresses []netip.Prefix, limits httpserver.Limits, localEndpoints func(types.NamespacedName, netip.Addr) int, proxyHealthy func() bool) *ServiceHealthServer {
	return newServiceHealthServer(ListenAddrs(nodePortAddresses, net.InterfaceAddrs), net.Listen, limits, localEndpoints, proxyHealthy)
}

func newServiceHealthServer(addrs []ListenAddr, listen func(network, address string) (net.Listener, error), limits httpserver.Limits, localEndpoints func(types.NamespacedName, netip.Addr) int, proxyHealthy func() bool) *ServiceHealthServer {
	if proxyHealthy == nil {
		proxyHealthy = func() bool { return true }
	}
	return &ServiceHealthServer{addrs: addrs, listen: listen, limits: limits, localEndpoints: localEndpoints, proxyHealthy: proxyHealthy, servers: map[types.NamespacedName]*serviceServer{}}
}

// ListenAddr is one address a healthCheckNodePort listens on: Network
// "tcp" with Host "" is every address of both families; "tcp4" 0.0.0.0
// and "tcp6" :: (IPV6_V6ONLY) every address of one.
type ListenAddr struct {
	Network, Host string
}

// ListenAddrs resolves --nodeport-addresses to where healthCheckNodePorts
// listen, as kube-proxy (NodePortAddresses.GetNodeIPs over
// net.InterfaceAddrs): without CIDRs, every address; else each address
// interfaceAddrs lists inside them. As for the NodePort rules, a family
// without a CIDR (or with a /0) is not restricted: it gets the family's
// wildcard, where the node has an address of the family at all (an IPv6
// wildcard fails on a node with IPv6 disabled). IPv6 link-local addresses
// are left out: they cannot be bound without their interface. When the
// addresses cannot be listed, every address, as kube-proxy, with an error
// logged. No address inside the CIDRs: the servers listen nowhere, as
// NodePorts answer nowhere.
func ListenAddrs(cidrs []netip.Prefix, interfaceAddrs func() ([]net.Addr, error)) []ListenAddr {
	all := []ListenAddr{{Network: "tcp"}}
	if len(cidrs) == 0 {
		return all
	}
	ifAddrs, err := interfaceAddrs()
	if err != nil {
		klog.ErrorS(err, "Failed to list the node's addresses for --nodeport-addresses; healthCheckNodePorts listen on every address", "nodePortAddresses", cidrs)
		return all
	}
	var local []netip.Addr
	for _, a := range ifAddrs {
		var ip net.IP
		switch a := a.(type) {
		case *net.IPNet:
			ip = a.IP
		case *net.IPAddr:
			ip = a.IP
		}
		if addr, ok := netip.AddrFromSlice(ip); ok {
			local = append(local, addr.Unmap())
		}
	}
	var out []ListenAddr
	wildcards := 0
	for _, f := range []struct {
		is       func(netip.Addr) bool
		wildcard ListenAddr
	}{
		{netip.Addr.Is4, ListenAddr{"tcp4", "0.0.0.0"}},
		{netip.Addr.Is6, ListenAddr{"tcp6", "::"}},
	} {
		var mine []netip.Prefix
		matchAll := false
		for _, c := range cidrs {
			if c, ok := netaddr.UnmapPrefix(c); ok && f.is(c.Addr()) {
				mine = append(mine, c)
				matchAll = matchAll || c.Bits() == 0
			}
		}
		if len(mine) == 0 || matchAll {
			if slices.ContainsFunc(local, f.is) {
				out = append(out, f.wildcard)
				wildcards++
			}
			continue
		}
		var found []netip.Addr
		for _, a := range local {
			if !f.is(a) || a.IsLinkLocalUnicast() && a.Is6() || slices.Contains(found, a) {
				continue
			}
			if slices.ContainsFunc(mine, func(c netip.Prefix) bool { return c.Contains(a) }) {
				found = append(found, a)
			}
		}
		slices.SortFunc(found, netip.Addr.Compare)
		for _, a := range found {
			out = append(out, ListenAddr{"tcp", a.String()})
		}
	}
	if wildcards == 2 {
		return all
	}
	if len(out) == 0 {
		klog.InfoS("No node address inside --nodeport-addresses: healthCheckNodePorts listen nowhere, as NodePorts answer nowhere", "nodePortAddresses", cidrs)
	}
	return out
}

// Descriptors accounts for the descriptors the servers' listeners hold
// (the proxier's descriptor budget of its sync): TakeN says why n may not
// be opened, GiveBackN returns what a server that did not open took.
type Descriptors interface {
	TakeN(n int) error
	GiveBackN(n int)
}

// UseDescriptors makes each server SyncServices opens take a descriptor
// per listen address from fds first. Without it the servers were opened
// outside the proxier's budget: Services with externalTrafficPolicy Local
// (one listener each per address) took the descriptors it keeps for
// connections, rule writes and the proxy's own servers.
func (s *ServiceHealthServer) UseDescriptors(fds Descriptors) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fds = fds
}

// SyncServices opens a server for each wanted Service port and closes the
// rest. A port that cannot be opened on every listen address (or for which
// no descriptor is to spare) is closed on all, reported and retried next
// sync, as kube-proxy does.
func (s *ServiceHealthServer) SyncServices(want map[types.NamespacedName]int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Refusals for want of descriptors are one error, with a count: an
	// error per Service was thousands of lines per retry.
	var short error
	refused := 0
	for nn, ss := range s.servers {
		if want[nn] != ss.port {
			ss.close()
			delete(s.servers, nn)
		}
	}
	var errs []error
	for nn, port := range want {
		if _, ok := s.servers[nn]; ok {
			continue
		}
		if s.fds != nil {
			if err := s.fds.TakeN(len(s.addrs)); err != nil {
				short = err
				refused++
				s.tellFailed(nn, port, err)
				continue
			}
		}
		ss := &serviceServer{port: port}
		for _, a := range s.addrs {
			ln, err := s.listen(a.Network, net.JoinHostPort(a.Host, strconv.Itoa(port)))
			if err != nil {
				errs = append(errs, fmt.Errorf("healthCheckNodePort %d of %s: %w", port, nn, err))
				s.tellFailed(nn, port, err)
				ss.close()
				ss = nil
				if s.fds != nil {
					s.fds.GiveBackN(len(s.addrs))
				}
				break
			}
			srv := httpserver.Serve(ln, s.handler(nn), s.limits)
			ss.srvs, ss.lns = append(ss.srvs, srv), append(ss.lns, ln)
		}
		if ss != nil {
			s.servers[nn] = ss
			delete(s.failed, nn)
		}
	}
	for nn := range s.failed {
		if _, ok := want[nn]; !ok {
			delete(s.failed, nn)
		}
	}
	if refused > 0 {
		errs = append(errs, fmt.Errorf("%d healthCheckNodePort servers not opened: %w", refused, short))
	}
	return errors.Join(errs...)
}

func (ss *serviceServer) close() {
	for _, srv := range ss.srvs {
		_ = srv.Close()
	}
	for _, ln := range ss.lns {
		_ = ln.Close()
	}
}

// Close stops every server.
func (s *ServiceHealthServer) Close() {
	_ = s.SyncServices(nil)
}

type serviceHealthBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (s *ServiceHealthServer) handler(nn types.NamespacedName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body serviceHealthBody
		body.Service.Namespace, body.Service.Name = nn.Namespace, nn.Name
		body.LocalEndpoints = s.localEndpoints(nn, localAddr(r))
		body.ServiceProxyHealthy = s.proxyHealthy()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(body.LocalEndpoints))
		if body.LocalEndpoints == 0 || !body.ServiceProxyHealthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	})
}

// localAddr is the address r arrived on (unmapped), invalid when not
// known.
func localAddr(r *http.Request) netip.Addr {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// tellFailed passes a listen failure to ListenFailed, unless this port of
// this Service was told already. Called with mu held.
func (s *ServiceHealthServer) tellFailed(nn types.NamespacedName, port int, err error) {
	if s.ListenFailed == nil || s.failed[nn] == port {
		return
	}
	if s.failed == nil {
		s.failed = make(map[types.NamespacedName]int)
	}
	s.failed[nn] = port
	s.ListenFailed(nn, port, err)
}
