package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/component-base/metrics/prometheus/slis"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	faultapi "github.com/kube-userspace-proxy/kube-userspace-proxy/faults/api"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/httpserver"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
)

// startServers starts the healthz, metrics and fault API servers. An
// address that cannot be bound (its port taken) is logged and tried again
// every serverRetryInterval until ctx ends, while the proxy serves, as
// kube-proxy's serveHealthz and serveMetrics do; with
// --bind-address-hard-fail it is an error, as there. The fault API, this
// proxy's own, is retried too: as an error, any local user who held its
// port kept the proxy from ever serving its Services.
func startServers(ctx context.Context, o *options, p *proxier.Proxier, health *healthcheck.ProxierHealth, m *proxier.Metrics, faultTable *faults.Table) ([]*http.Server, string, error) {
	var servers []*http.Server
	closeAll := func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}
	// serve returns the address bound, or "" while it is being retried.
	serve := func(flag, addr string, mux *http.ServeMux) (string, error) {
		s, bound, err := httpserver.Start(addr, mux, o.httpLimits())
		if err == nil {
			servers = append(servers, s)
			return bound.String(), nil
		}
		if o.bindAddressHardFail {
			closeAll()
			return "", fmt.Errorf("%s: %w", flag, err)
		}
		klog.ErrorS(err, "Server failed to start; retrying in the background (--bind-address-hard-fail makes this fatal)", "flag", flag, "address", addr, "interval", serverRetryInterval)
		go retryServer(ctx, flag, addr, mux, o.httpLimits())
		return "", nil
	}
	if o.healthzBindAddress != "" {
		mux := http.NewServeMux()
		mux.Handle("/healthz", health.Handler(false, func(c int) { m.ProxyHealthzTotal.WithLabelValues(strconv.Itoa(c)).Inc() }))
		mux.Handle("/livez", health.Handler(true, func(c int) { m.ProxyLivezTotal.WithLabelValues(strconv.Itoa(c)).Inc() }))
		addr, err := serve("--healthz-bind-address", o.healthzBindAddress, mux)
		if err != nil {
			return nil, "", err
		}
		if addr != "" {
			klog.InfoS("Health server listening", listeningAt(o.healthzBindAddress, addr)...)
		}
	}
	metricsAddr := ""
	if o.metricsBindAddress != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
		mux.Handle("/debug/services", p.DebugHandler())
		mux.Handle("/debug/connections", p.ConnectionsHandler())
		mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			fmt.Fprint(w, "userspace")
		})
		mux.Handle("/configz", configzHandler(o.effectiveConfig()))
		mux.Handle("/healthz", pingHandler())
		mux.Handle("/healthz/ping", pingCheckHandler())
		// kube-proxy's SLI metrics: the results of /healthz's ping check
		// (pingHandler) and the start time; DELETE resets them.
		slis.SLIMetricsWithReset{}.Install(mux)
		addr, err := serve("--metrics-bind-address", o.metricsBindAddress, mux)
		if err != nil {
			return nil, "", err
		}
		metricsAddr = addr
	}
	if o.faultAPIBind != "" {
		mux := http.NewServeMux()
		mux.Handle("/", faultapi.New(faultTable, buildVersion()))
		addr, err := serve("--fault-api-bind-address", o.faultAPIBind, mux)
		if err != nil {
			return nil, "", err
		}
		if addr != "" {
			klog.InfoS("Fault API (Toxiproxy's REST API) listening", listeningAt(o.faultAPIBind, addr)...)
		}
	}
	return servers, metricsAddr, nil
}

// bothFamilies is what a server on a wildcard address listens on.
const bothFamilies = "IPv4 and IPv6"

// shownAddress is the address a server listens on as the user gave it
// (with the port bound, for port 0), and whether it takes both families:
// Go listens on a wildcard address (0.0.0.0, "", ::) with one dual-stack
// IPv6 socket, whose address [::]:10256 read as IPv6 only beside the
// default --healthz-bind-address 0.0.0.0:10256.
func shownAddress(given, bound string) (string, bool) {
	b, err := netip.ParseAddrPort(bound)
	if err != nil || b.Addr() != netip.IPv6Unspecified() {
		return bound, false
	}
	host, _, err := net.SplitHostPort(given)
	if err != nil {
		return bound, true
	}
	return net.JoinHostPort(host, strconv.Itoa(int(b.Port()))), true
}

// listeningAt is the key/value pairs of a server's listening line: its
// address as given and, on a wildcard address, the families it takes.
func listeningAt(given, bound string) []any {
	shown, dual := shownAddress(given, bound)
	if dual {
		return []any{"address", shown, "families", bothFamilies}
	}
	return []any{"address", shown}
}

// serverRetryInterval is kube-proxy's wait between tries of a server that
// could not bind (a variable: tests shorten it).
var serverRetryInterval = 5 * time.Second

// retryServer tries to start h on addr every serverRetryInterval until it
// binds, then serves until ctx ends.
func retryServer(ctx context.Context, flag, addr string, h http.Handler, limits httpserver.Limits) {
	tick := time.NewTicker(serverRetryInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s, bound, err := httpserver.Start(addr, h, limits)
		if err != nil {
			klog.ErrorS(err, "Server failed to start; retrying", "flag", flag, "address", addr)
			continue
		}
		klog.InfoS("Server listening after retrying", append([]any{"flag", flag}, listeningAt(addr, bound.String())...)...)
		<-ctx.Done()
		_ = s.Close()
		return
	}
}

// healthTimeout is how long a queued change may wait for a sync before
// /healthz fails: two sync periods, as kube-proxy's, saturating, since a
// sync period above half the largest duration (2562047h, a "never")
// doubled to a negative timeout and any queued change failed the probe.
func healthTimeout(syncPeriod time.Duration) time.Duration {
	return time.Duration(mono.Add(int64(syncPeriod), syncPeriod))
}

// httpLimits are the limits of every HTTP server: the defaults with the
// idle timeout and connection cap of the flags.
func (o *options) httpLimits() httpserver.Limits {
	l := httpserver.DefaultLimits
	l.IdleTimeout = o.httpIdleTimeout
	l.MaxConns = o.httpMaxConns
	return l
}
