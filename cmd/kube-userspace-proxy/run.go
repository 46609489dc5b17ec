package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/netaddr"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// source is what feeds the proxier: manifests or an API server.
type source interface {
	Run(ctx context.Context) error
}

// started is told the proxier and the servers' addresses once they run;
// the demo uses it, main passes nil.
type started func(p *proxier.Proxier, metricsAddr string)

// proxyServer is what run builds from the flags before anything serves,
// as kube-proxy's ProxyServer (newProxyServer), and serves until its
// context ends (its run, kube-proxy's Run).
type proxyServer struct {
	o *options
	v *validated
	// client is the API server's (nil with --manifests): one for the
	// Node's read, the events and the informers.
	client        kubernetes.Interface
	metrics       *proxier.Metrics
	health        *healthcheck.ProxierHealth
	faultTable    *faults.Table
	serviceHealth *healthcheck.ServiceHealthServer
	proxier       *proxier.Proxier
	src           source
	// lastState keeps the last known state (nil without --state-file).
	lastState *config.LastKnownState
	// restart (nil without rules) is how a node IP watch asks for a
	// restart: the first to ask is told on nodeIPsErr.
	restart    func(error)
	nodeIPsErr chan error
	// noOtherProxy is closed once no other proxy programs this network
	// namespace's rules (instanceClaim.NoProxyHolds; closed at once
	// without rules): run starts the proxier only then.
	noOtherProxy <-chan struct{}
	// waitHealth is the proxier's health updater: changes that come
	// while noOtherProxy is open do not age into a failed /livez.
	waitHealth *healthWhileWaiting
	// closers release what newProxyServer took, the last taken first.
	closers []func()
}

// errStoppedEarly: the context ended while newProxyServer waited (the
// iptables probe waiting out a held lock); nothing is set up, and run
// returns nil.
var errStoppedEarly = errors.New("stopped before serving")

// run wires source → proxier → sockets + rules and serves until ctx ends.
func run(ctx context.Context, o *options, v *validated, onStart started) error {
	s, err := newProxyServer(ctx, o, v, time.Now())
	if errors.Is(err, errStoppedEarly) {
		return nil
	}
	if err != nil {
		return err
	}
	defer s.close()
	return s.run(ctx, onStart)
}

// newProxyServer builds the proxier and its source from the flags: the
// API client and the Node's IPs, the metrics, health and faults, the
// portal rules (when programmed), the proxier, and the source that feeds
// it. began is when --state-file-grace counts from. On an error what it
// took is released.
func newProxyServer(ctx context.Context, o *options, v *validated, began time.Time) (_ *proxyServer, err error) {
	s := &proxyServer{o: o, v: v}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if o.manifests == "" {
		if s.client, err = apiClient(o); err != nil {
			return nil, err
		}
		readNodeObjectIPs(ctx, s.client, o, v, isLocalAddress)
	}
	resolveNodePortAddresses(v)
	warnBindAddressNotLocal(v.bind, isLocalAddress)
	warnProxyPortsOverNodePorts(v.portRange, v.nodePorts)
	warnFaultAPIBeyondLoopback(o.faultAPIBind)
	clk := clock.RealClock{}
	s.metrics = proxier.NewMetrics()
	s.health = healthcheck.NewProxierHealth(clk, healthTimeout(o.syncPeriod))
	s.faultTable = faults.NewTable(o.faultSeed, o.faultMaxActive, faults.NewMetrics(s.metrics.Registry))
	s.faultTable.SetMaxBufferedBytes(o.faultMaxBuffered)
	// Only the API can take a port down at any moment, so only then does
	// faults track every connection; without it a declared down toxic's
	// cut of those that drew no fault walks the proxier's registry.
	s.faultTable.TrackLive = o.faultAPIBind != ""

	popts := proxierOptions(o, v, clk, s.metrics, s.health, s.faultTable)
	claim, err := s.portals(ctx, &popts)
	if err != nil {
		return nil, err
	}
	// Where NodePorts answer (--nodeport-addresses), as kube-proxy: not on
	// --bind-address, which is the proxy sockets' address.
	s.serviceHealth = healthcheck.NewServiceHealthServer(v.nodePortAddresses, o.httpLimits(), func(nn types.NamespacedName, at netip.Addr) int { return s.proxier.LocalEndpointsAt(nn, at) },
		func() bool { ok, _ := s.health.Healthy(); return ok })
	s.closers = append(s.closers, s.serviceHealth.Close)
	popts.ServiceHealth = s.serviceHealth
	s.waitHealth = &healthWhileWaiting{inner: s.health, waitOver: s.noOtherProxy}
	popts.Health = s.waitHealth
	s.proxier = proxier.New(popts)
	if claim != nil {
		claim.OnOtherGone(s.proxier.RepairSoon) // rules to repair
	}
	if o.manifests == "" {
		registerRESTClientMetrics(s.metrics.Registry)
	}
	if err := s.newSource(began); err != nil {
		return nil, err
	}
	return s, nil
}

// portals sets popts up for the portal rules when the proxy programs them
// (the instance claim, which it returns, the syncers per family, the
// NodePort claims), and the families /healthz and the metrics report: a
// specific --bind-address's, else both; with rules, those the node has
// syncers for. Without rules, leftover rules of an earlier run are looked
// for in the background.
func (s *proxyServer) portals(ctx context.Context, popts *proxier.Options) (*instanceClaim, error) {
	ipv4, ipv6 := true, true
	if family, ok := bindFamily(s.v); ok {
		ipv4, ipv6 = family == iptables.IPv4, family == iptables.IPv6
	}
	// Closed once no other proxy programs this network namespace's rules:
	// until then the proxier does not run (no rule, no proxy socket).
	alone := make(chan struct{})
	close(alone)
	s.noOtherProxy = alone
	var claim *instanceClaim
	if s.o.iptables {
		if !canProgramIptables() {
			return nil, errNoNetAdmin
		}
		var held bool
		var other int
		claim, held, other = claimInstance()
		s.closers = append(s.closers, claim.release)
		s.noOtherProxy = claim.NoProxyHolds()
		if held {
			klog.ErrorS(nil, "Another kube-userspace-proxy is running in this network namespace: this one writes no rule and opens no proxy socket until it exits (the two would rewrite each other's portal rules, and Services fail by turns); stop one, or run this one with --iptables=false", "pid", pidValue(other))
		}
		v4, v6, err := portalSyncers(ctx, s.v, iptables.NewRunner)
		if ctx.Err() != nil {
			return nil, errStoppedEarly // while the probe waited out a held lock
		}
		if err != nil {
			return nil, err
		}
		popts.IPv4Portals, popts.IPv6Portals = v4, v6
		ipv4, ipv6 = v4 != nil, v6 != nil
		popts.ClaimNodePorts = true
		popts.OtherProxyRunning = claim.othersRunning
		popts.Conntrack = proxier.NetlinkConntrack{}
	} else if canProgramIptables() {
		// In the background: reading the rules may wait for the xtables
		// lock, and the flag promises a start that needs no iptables.
		go warnLeftoverPortals(iptables.NewRunner)
	}
	s.health.SetFamilies(servedFamilies(ipv4, ipv6)...)
	s.metrics.SetFamilies(servedFamilies(ipv4, ipv6)...)
	return claim, nil
}

// newSource builds what feeds the proxier: the source the flags name,
// through the last known state when --state-file keeps one, and the
// handler of this node's Node object (with rules, its IPs are watched and
// a change asks for a restart).
func (s *proxyServer) newSource(began time.Time) error {
	var h config.Handler = s.proxier
	s.nodeIPsErr = make(chan error, 1)
	if s.o.iptables {
		s.restart = func(err error) { // the first of the watches to ask is told
			select {
			case s.nodeIPsErr <- err:
			default:
			}
		}
	}
	var nodes config.NodeHandler = nodeState{s.health, s.proxier, newNodeIPsWatch(s.v, isLocalAddress, s.restart), new(atomic.Bool)}
	if s.o.stateFile != "" {
		s.lastState = config.NewLastKnownState(s.o.stateFile, s.proxier, s.o.stateFileGrace)
		s.lastState.GraceFrom(began)
		registerLastKnownStateMetrics(s.metrics.Registry, s.lastState)
		h, nodes = s.lastState, s.lastState.Nodes(nodeName(s.o.hostnameOverride), nodes)
	}
	var err error
	s.src, err = newSource(s.o, s.v, s.client, h, nodes)
	return err
}

// close releases what newProxyServer took, the last taken first.
func (s *proxyServer) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// run starts the servers, the watches, the source and the proxier, tells
// onStart (nil: no one), and serves until ctx ends or the source, a node
// IP watch or the --config file's watch ends it with an error.
func (s *proxyServer) run(ctx context.Context, onStart started) error {
	o := s.o
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var events *nodeEvents
	if s.client != nil {
		events = startNodeEvents(ctx, s.client, nodeName(o.hostnameOverride))
		s.serviceHealth.ListenFailed = events.healthCheckFailed
	}
	servers, metricsAddr, err := startServers(ctx, o, s.proxier, s.health, s.metrics, s.faultTable)
	if err != nil {
		return err
	}
	defer func() {
		for _, srv := range servers {
			_ = srv.Close()
		}
	}()

	if o.iptables {
		go newRouteIPsWatch(s.v, isLocalAddress, s.restart).run(ctx, routeIPsInterval)
	}
	srcErr := make(chan error, 1)
	go func() { srcErr <- s.src.Run(ctx) }()
	// proxierDone also waits for the last known state's last write, made
	// when ctx ends.
	proxierDone := make(chan struct{})
	go func() {
		if !s.awaitTurn(ctx) {
			// Stopped while another proxy ran: nothing of this one's to
			// stop (the other's rules and accepts stay as they are).
			close(proxierDone)
			return
		}
		var wg sync.WaitGroup
		if s.lastState != nil {
			wg.Go(func() { s.lastState.Run(ctx) })
		}
		s.proxier.Run(ctx)
		wg.Wait()
		close(proxierDone)
	}()
	if onStart != nil {
		onStart(s.proxier, metricsAddr)
	}
	shownMetrics, dual := shownAddress(o.metricsBindAddress, metricsAddr)
	if dual {
		shownMetrics += " (" + bothFamilies + ")"
	}
	if shownMetrics == "" && o.metricsBindAddress != "" {
		// Its port is taken and retried (startServers): "" read as none.
		shownMetrics = o.metricsBindAddress + " (not bound yet; retrying)"
	}
	klog.InfoS("kube-userspace-proxy running", "mode", "userspace", "iptables", o.iptables, "bindAddress", s.v.bind, "metrics", shownMetrics)
	s.proxier.LogLimits()
	if events != nil {
		events.started()
	}

	configErr := make(chan error, 1)
	if o.configCheck != nil {
		go func() {
			configErr <- watchConfigFile(ctx, o.configFile, o.configLoaded, o.configCheck, configPollInterval)
		}()
	}
	select {
	case err = <-s.nodeIPsErr:
		cancel()
		<-proxierDone
		return err
	case err = <-configErr:
		if err != nil {
			cancel()
			<-proxierDone
			return err
		}
	case err = <-srcErr:
		if err != nil && !errors.Is(err, context.Canceled) {
			cancel()
			<-proxierDone
			return err
		}
	case <-ctx.Done():
	}
	cancel()
	<-proxierDone
	if o.iptables {
		klog.InfoS("Stopped; portal rules stay in place until --cleanup")
	} else {
		klog.InfoS("Stopped")
	}
	return nil
}

// awaitTurn waits until no other proxy programs this network namespace's
// rules, then owes the changes held back meanwhile (takeOver), and reports
// true; false when ctx ends first.
func (s *proxyServer) awaitTurn(ctx context.Context) bool {
	select {
	case <-s.noOtherProxy:
		s.waitHealth.takeOver()
		return true
	case <-ctx.Done():
		return false
	}
}

// proxierOptions are the proxier's settings the flags give; run adds the
// portal syncers, the NodePort claims and the service health server.
func proxierOptions(o *options, v *validated, clk clock.WithTicker, metrics *proxier.Metrics, health *healthcheck.ProxierHealth, faultTable *faults.Table) proxier.Options {
	popts := proxier.Options{
		BindAddress:             v.bind,
		PortRange:               v.portRange,
		NodePortRange:           v.nodePorts,
		UDPIdleTimeout:          o.udpTimeout,
		MinSyncPeriod:           o.effectiveMinSyncPeriod(),
		MinSyncPeriodSet:        true, // the flag's 0 means no minimum, not the default
		SyncPeriod:              o.syncPeriod,
		HalfCloseTimeout:        o.halfCloseTimeout,
		MultipathTCP:            o.multipathTCP,
		DataPath:                o.dataPath,
		Liveness:                o.liveness(),
		WriteTimeout:            o.tcpWriteTimeout,
		MaxConnectionAge:        o.maxConnectionAge,
		ConnectionCloseQuiet:    o.closeQuiet,
		ConnectionCloseDeadline: o.closeDeadline,
		Affinity:                loadbalancer.Limits{MaxAffinityEntries: o.affinityMaxEntries},
		Health:                  health,
		Metrics:                 metrics,
		Clock:                   clk,
		NodeName:                nodeName(o.hostnameOverride),
		Faults:                  faultTable,
	}
	popts.UDPMaxSessionsPerPort, popts.UDPMaxSessions = o.udpMaxPerPort, o.udpMaxSessions
	popts.TCPMaxConnectionsPerPort = o.tcpMaxPerPort
	if !o.udpMaxPerPortGiven {
		popts.UDPMaxSessionsPerPort = 0 // the default, which the descriptor limit scales
	}
	return popts
}

// manifestOptions are what the flags set in a manifest source, the
// proxy's and explain's alike.
func manifestOptions(v *validated, opts ...config.Option) []config.Option {
	return append([]config.Option{config.WithServiceClusterIPRange(v.serviceCIDRs), config.WithNodePortRange(v.nodePorts)}, opts...)
}

// newSource builds the source the flags name, feeding h; nodes (nil: none)
// follows this node's Node object when the source is an API server, read
// through client (nil: one is made from the flags).
func newSource(o *options, v *validated, client kubernetes.Interface, h config.Handler, nodes config.NodeHandler) (source, error) {
	if o.manifests != "" {
		if _, err := os.Stat(o.manifests); err != nil {
			return nil, fmt.Errorf("--manifests: %w", err)
		}
		return config.NewManifestSource(o.manifests, h, manifestOptions(v)...), nil
	}
	if client == nil {
		var err error
		if client, err = apiClient(o); err != nil {
			return nil, err
		}
	}
	return config.NewInformerSource(client, h, config.InformerOptions{
		ConfigSyncPeriod: o.configSyncPeriod,
		NodeName:         nodeName(o.hostnameOverride),
		NodeHandler:      nodes,
	}), nil
}

// apiClient is the API server client the flags name (--kubeconfig,
// --master, in-cluster config), with kube-proxy's QPS, burst and content
// type options.
func apiClient(o *options) (kubernetes.Interface, error) {
	cfg, err := config.BuildClientConfig(o.kubeconfig, o.master)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = o.kubeAPIQPS, o.kubeAPIBurst
	if o.kubeAPIContentType != "" {
		cfg.ContentType = o.kubeAPIContentType
	}
	cfg.AcceptContentTypes = o.acceptContentTypes()
	cfg.Dial = apiDialer.DialContext
	shortenAPIHealthCheck()
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	return client, nil
}

// apiHealthCheck is client-go's HTTP/2 health check of the API server
// connection as this proxy sets it (its environment variables, read when
// the client is made): a ping after 5 s without a frame, the connection
// given up when its answer takes 5 s more. client-go's 30 s and 15 s left
// a connection that died silently (the API server's host or load balancer
// failed over, a NAT entry on the way was lost: the watches, which send
// nothing, are not told) in use for up to 45 s, and the Services on stale
// endpoints meanwhile; a change made while it was down was served 30 s late
// (test/e2ecp TestWatchConnectionLost). A ping is 17 bytes both ways on an
// idle connection only; a value the environment gives is kept (empty is
// unset, as client-go reads it).
var apiHealthCheck = [...]struct{ env, seconds string }{
	{"HTTP2_READ_IDLE_TIMEOUT_SECONDS", "5"},
	{"HTTP2_PING_TIMEOUT_SECONDS", "5"},
}

// apiLiveness is how the kernel finds a dead API server connection that
// carries no HTTP/2 health check (an API server, or a proxy in front of it,
// that speaks HTTP/1.1; DISABLE_HTTP2): keep-alive probes after 5 s idle,
// 2 s apart, and the connection ends when probes, or data sent, went
// unacknowledged for 11 s, about when the HTTP/2 check gives up
// (apiHealthCheck). client-go's dialer (keep-alive 30 s idle, then Go's
// 15 s x 9) left a watch whose connection went nowhere (a NAT or load
// balancer entry lost on the way) hung for 165 s, and every change
// meanwhile unserved (measured against kube-apiserver, HTTP/1.1). The
// kernel answers probes for a process that is stopped or starved: a busy
// API server's connections are not dropped by it.
var apiLiveness = relay.Liveness{KeepAliveIdle: 5 * time.Second, KeepAliveInterval: 2 * time.Second, KeepAliveCount: 3, UserTimeout: 11 * time.Second}

// apiDialer dials the API server: client-go's 30 s dial timeout, and
// apiLiveness on the socket (Go's own keep-alive settings, applied after
// the connect, would override it: off).
var apiDialer = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: -1, Control: apiLiveness.Control}

// shortenAPIHealthCheck sets apiHealthCheck's variables the environment
// does not set.
func shortenAPIHealthCheck() {
	for _, v := range apiHealthCheck {
		if os.Getenv(v.env) == "" {
			_ = os.Setenv(v.env, v.seconds)
		}
	}
}

// acceptContentTypes is what the API client asks the server for, as
// kube-proxy's createClient sets it: clientConnection.acceptContentTypes
// when the file gives it; else protobuf, JSON as its fallback, for the
// protobuf content type (what client-go asks for by default), and nothing
// for another, which client-go sends as "TYPE, */*". It was protobuf
// whatever the content type: --kube-api-content-type application/json
// changed only the events' bodies, lists and watches still came back
// protobuf.
func (o *options) acceptContentTypes() string {
	switch {
	case o.kubeAPIAcceptContentTypes != "":
		return o.kubeAPIAcceptContentTypes
	case o.kubeAPIContentType == "" || o.kubeAPIContentType == config.ContentType:
		return config.AcceptContentTypes
	}
	return ""
}

// nodeState follows this node's Node object: its deletion makes /healthz
// fail, so external load balancers drain the node (as kube-proxy does), and
// its zone drives topology-aware routing.
type nodeState struct {
	h   *healthcheck.ProxierHealth
	p   *proxier.Proxier
	ips *nodeIPsWatch
	// present is whether the Node last delivered exists.
	present *atomic.Bool
}

func (n nodeState) OnNodeChange(node config.NodeInfo) {
	n.present.Store(!node.Deleted)
	n.h.SetNodeDeleted(node.Deleted || node.Terminating)
	n.p.SetNodeZone(node.Zone)
	n.ips.check(node)
}

// OnNodeSynced: a Node the informer's first list did not hold (a
// --hostname-override that names no Node) is not eligible, as kube-proxy's
// NodeEligible (no Node: false), so /healthz answers 503 with
// nodeEligible false until the Node appears; it answered 200.
func (n nodeState) OnNodeSynced() {
	if !n.present.Load() {
		n.h.SetNodeDeleted(true)
	}
}

// nodeName is the name this node's endpoints and Node object carry. Node
// names are lower case; kube-proxy trims and lowercases the hostname, and an
// override too (an override read from a file keeps its newline, and
// "Node-1" names no Node: no endpoint would be local).
func nodeName(override string) string {
	h := override
	if h == "" {
		h, _ = os.Hostname()
	}
	return strings.ToLower(strings.TrimSpace(h))
}

// servedFamilies names the IP families served, as /healthz's per-family
// status keys them (kube-proxy's v1.IPFamily values).
func servedFamilies(ipv4, ipv6 bool) []string {
	var fams []string
	if ipv4 {
		fams = append(fams, "IPv4")
	}
	if ipv6 {
		fams = append(fams, "IPv6")
	}
	return fams
}

// warnBindAddressNotLocal warns when --bind-address names an address no
// interface holds: every proxy socket then fails to listen ("cannot assign
// requested address") while /healthz says 200, and nothing at start said
// why. Not an error: the address may be added later (a VIP, DHCP), and
// each sync tries the sockets again. IPv4 loopback addresses are all held
// by lo (its 127.0.0.0/8 local route), though only 127.0.0.1 is listed.
func warnBindAddressNotLocal(bind netip.Addr, isLocal func(netip.Addr) bool) {
	if !bind.IsValid() || bind.IsUnspecified() || bind.IsLoopback() || isLocal(bind) {
		return
	}
	klog.InfoS("Warning: --bind-address is not an address of this node's interfaces: proxy sockets cannot listen on it until it is added", "bindAddress", bind)
}

// warnProxyPortsOverNodePorts warns when --proxy-port-range overlaps
// --service-node-port-range: the proxy gives no proxy socket a Service's
// node port, so a NodePort there shrinks the range, and a socket on a port
// that becomes one moves to another (the default ports stay out of the
// node port range).
func warnProxyPortsOverNodePorts(r proxier.PortRange, nodePorts config.PortRange) {
	if r.Size == 0 || r.Base > int(nodePorts.Max) || r.Base+r.Size-1 < int(nodePorts.Min) {
		return
	}
	klog.InfoS("Warning: --proxy-port-range overlaps --service-node-port-range: a port of it that is a Service's node port is no proxy socket's (a socket on a port that becomes one moves to another)",
		"proxyPortRange", r.String(), "serviceNodePortRange", nodePorts.String())
}

// warnFaultAPIBeyondLoopback warns when the fault API listens on more than
// loopback: it has no authentication, and anyone who reaches it can take
// every Service down or hold its traffic (README: "Bind it to loopback").
// Not an error: a node's own firewall, or a test cluster, may make it safe.
func warnFaultAPIBeyondLoopback(addr string) {
	if addr == "" {
		return
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "localhost" {
		return // validated before; localhost is loopback
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return
	}
	klog.InfoS("Warning: --fault-api-bind-address listens beyond loopback, without authentication: anyone who reaches it can take every Service down", "address", addr)
}

// isLocalAddress reports whether ip is an address of one of the node's
// interfaces (true when they cannot be listed: no warning then).
func isLocalAddress(ip netip.Addr) bool {
	local, err := netaddr.IsLocal(ip)
	return local || err != nil
}

// cleanupRules is --cleanup's work (a variable: tests must not run it on
// the host).
var cleanupRules = iptables.CleanupAll
