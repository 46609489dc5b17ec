package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/httpserver"
)

// ServiceHealthServer serves the healthCheckNodePort of every Service with
// externalTrafficPolicy Local: 200 while this node has a ready local
// endpoint, 503 otherwise, so cloud load balancers send traffic only to
// nodes that can serve it without leaving the node.
type ServiceHealthServer struct {
	bindHost       string
	limits         httpserver.Limits
	localEndpoints func(types.NamespacedName) int
	proxyHealthy   func() bool

	mu      sync.Mutex
	servers map[types.NamespacedName]*serviceServer
}

type serviceServer struct {
	port int
	srv  *http.Server
}

// NewServiceHealthServer listens on bindHost (empty = all addresses), each
// server held to limits, and asks localEndpoints for the count per Service
// on each request, and proxyHealthy (nil: always) whether this proxy's syncs
// keep up: as kube-proxy's, a node whose rules lag fails every Service's
// check, so load balancers stop sending to it.
func NewServiceHealthServer(bindHost string, limits httpserver.Limits, localEndpoints func(types.NamespacedName) int, proxyHealthy func() bool) *ServiceHealthServer {
	if proxyHealthy == nil {
		proxyHealthy = func() bool { return true }
	}
	return &ServiceHealthServer{bindHost: bindHost, limits: limits, localEndpoints: localEndpoints, proxyHealthy: proxyHealthy, servers: map[types.NamespacedName]*serviceServer{}}
}

// SyncServices opens a server for each wanted Service port and closes the
// rest. A port that cannot be opened is reported and retried next sync.
func (s *ServiceHealthServer) SyncServices(want map[types.NamespacedName]int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for nn, ss := range s.servers {
		if want[nn] != ss.port {
			_ = ss.srv.Close()
			delete(s.servers, nn)
		}
	}
	var errs []error
	for nn, port := range want {
		if _, ok := s.servers[nn]; ok {
			continue
		}
		srv, _, err := httpserver.Start(net.JoinHostPort(s.bindHost, strconv.Itoa(port)), s.handler(nn), s.limits)
		if err != nil {
			errs = append(errs, fmt.Errorf("healthCheckNodePort %d of %s: %w", port, nn, err))
			continue
		}
		s.servers[nn] = &serviceServer{port: port, srv: srv}
	}
	return errors.Join(errs...)
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
		body.LocalEndpoints = s.localEndpoints(nn)
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
