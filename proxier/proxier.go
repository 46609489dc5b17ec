// Package proxier owns the service-port table: for every Service port it
// keeps a proxy socket (tcp.go, udp.go) on a local port, tells the load
// balancer about affinity and endpoints, and hands the portal rules that
// send service traffic to those sockets to an iptables syncer (portals.go).
// Events come from a source in the config sub-package.
//
// Service changes go through the rate-limited sync (proxier.go), the only
// path that creates proxy sockets or writes portal rules. EndpointSlice
// changes go from the endpoints tracker (endpoints.go) straight to the
// balancer, without a sync and without iptables. Around the sockets it
// also owns the NodePorts it holds open (claim.go), the stale conntrack
// entries it clears (conntrack.go), each port's faults and connection
// lifetime (faults.go, lifetime.go), the registry of live connections
// (connections.go) and the debug and metrics views of all of these.
package proxier

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// HealthUpdater is told when changes are queued and when a sync finished
// (kube-proxy's ProxierHealthUpdater): Updated names the IP families whose
// rules the sync wrote ("IPv4", "IPv6"; none: every family).
type HealthUpdater interface {
	QueuedUpdate()
	Updated(families ...string)
}

// Options configure a Proxier.
type Options struct {
	BindAddress netip.Addr
	PortRange   PortRange
	// NodePortRange is where the API server allocates node ports
	// (--service-node-port-range; zero: config.DefaultNodePortRange):
	// proxy ports are not taken from it when PortRange is empty.
	NodePortRange    config.PortRange
	UDPIdleTimeout   time.Duration
	MinSyncPeriod    time.Duration
	SyncPeriod       time.Duration
	HalfCloseTimeout time.Duration
	// MinSyncPeriodSet takes MinSyncPeriod, the least time between two
	// syncs while Services change (--iptables-min-sync-period), as given,
	// 0 included: 0 is then kube-proxy's "no minimum", a sync as soon as
	// a change arrives. The command sets it with its flag's value (and
	// refuses a negative one). Without it a zero MinSyncPeriod is
	// kube-proxy's default, 1 s, as other unset fields take their
	// defaults: a library caller or test that builds Options{} keeps the
	// rate limit rather than syncing on every change. A negative one is
	// the default either way.
	MinSyncPeriodSet bool
	// MultipathTCP listens for clients with MPTCP (off: plain TCP, cheaper
	// per connection; see tcpListenConfig).
	MultipathTCP bool
	// Liveness finds dead peers on both proxied sockets (keep-alive,
	// TCP_USER_TIMEOUT); the zero value leaves both off.
	Liveness relay.Liveness
	// WriteTimeout: a direction that cannot write a byte this long ends
	// the connection with resets; 0 = no bound.
	WriteTimeout time.Duration
	// MaxConnectionAge closes TCP connections older than this at their
	// next quiet moment, for Services without the max-connection-age
	// annotation; 0 = off. ConnectionCloseQuiet is that quiet time (0:
	// relay.DefaultQuiet); it applies to drain-removed as well.
	// ConnectionCloseDeadline closes a connection still busy this long
	// after either came due; 0 = wait for quiet however long
	// (DefaultConnectionCloseDeadline is the binary's default).
	MaxConnectionAge        time.Duration
	ConnectionCloseQuiet    time.Duration
	ConnectionCloseDeadline time.Duration
	// Affinity bounds the ClientIP affinity tables (zero: no cap).
	Affinity loadbalancer.Limits
	// Portals by family; empty means --iptables=false (sockets only).
	IPv4Portals PortalSyncer
	IPv6Portals PortalSyncer
	// ClaimNodePorts holds NodePorts (and local external IP ports) open, as
	// the legacy proxier did, so no other process can take them unnoticed.
	ClaimNodePorts bool
	// OtherProxyRunning reports whether another proxy programs the rules
	// of this network namespace (cmd's instance claim): a stopping proxy
	// then leaves the accepts of portal traffic (PortalStopper) to it.
	OtherProxyRunning func() bool
	Health            HealthUpdater
	Metrics           *Metrics
	Clock             clock.WithTicker
	Dialer            Dialer
	// DialTimeouts are a connection's dial attempts (at most
	// maxDialAttempts are used; nil or empty: defaultDialTimeouts).
	DialTimeouts []time.Duration
	// NodeName is this node, for node-local traffic policies and topology
	// hints; its zone arrives later through SetNodeZone.
	NodeName string
	// Conntrack clears stale flows when a proxy socket is new, and those
	// to a destination a UDP one loses or had when it closes (see
	// ConntrackCleaner); nil with portals off (no NAT, nothing stale).
	Conntrack ConntrackCleaner
	// ServiceHealth serves healthCheckNodePorts of externalTrafficPolicy
	// Local Services; nil disables them.
	ServiceHealth ServiceHealthSyncer
	// Faults holds every service port's toxics (annotation and API); nil
	// builds one with seed 0 whose metrics join Metrics' registry.
	Faults *faults.Table

	// UDP session caps per service port and in total; 0 takes the
	// defaults. The total is also held to half of RLIMIT_NOFILE, and the
	// per-port cap to the total; the default per-port cap is lowered with
	// the total by the same factor (udpCaps).
	UDPMaxSessionsPerPort, UDPMaxSessions int
	// TCPMaxConnectionsPerPort caps each TCP proxy socket's connections
	// (tcp_share.go); 0: a quarter of the connections' descriptor ceiling,
	// following the open-file limit; negative: no cap.
	TCPMaxConnectionsPerPort int

	// DataPath is how TCP connections are relayed: DataPathGoroutines
	// (also ""), or DataPathEventLoop.
	DataPath string
	// EventLoops is the number of loops of the event-loop data path; 0:
	// GOMAXPROCS.
	EventLoops int
}

// ServiceHealthSyncer is told which Services need a healthCheckNodePort
// server, keyed by Service, valued by port.
type ServiceHealthSyncer interface {
	SyncServices(ports map[types.NamespacedName]int) error
}

// activePort is one proxied service port: its socket and what it was built from.
type activePort struct {
	info      *servicePortInfo
	socket    proxySocket
	proxyPort int
	// external serves NodePort/externalIP/LB traffic when its endpoint set
	// differs from ClusterIP traffic's (a Local traffic policy); else nil.
	external     proxySocket
	externalPort int
	// externalErr is why the second socket a split policy needs did not
	// open (the last try's error, retried), for /debug/services; "" else.
	externalErr string
	claims      []func() error // close functions of held NodePort/external IP sockets
	// claimsMissing: a port of claims could not be held (claimPorts);
	// each sync tries again.
	claimsMissing bool
	faults        *faults.Port
}

// Proxier implements config.Handler.
type Proxier struct {
	opts      Options
	lb        *loadbalancer.LoadBalancer
	endpoints *endpointsTracker
	ports     *PortAllocator
	fds       *descriptorBudget
	sockCfg   *socketConfig
	runner    *boundedFrequencyRunner
	metrics   *Metrics
	clk       clock.WithTicker
	// limitLines are the descriptor caps New set, for LogLimits.
	limitLines []logLine

	// Change tracker: the latest Service objects, written by the source,
	// read by sync.
	mu       sync.Mutex
	services map[types.NamespacedName]*v1.Service
	// parsed caches servicePorts of each Service object, so a sync parses
	// only the Services that changed since the previous one.
	parsed map[types.NamespacedName]parsedService
	// validFaults is, per Service, the last faults annotation that
	// applyFaultsNow found valid (and gave its open ports), which a sync
	// that parsed an older one applies when the latest is invalid.
	validFaults map[types.NamespacedName]faultsAnnotation
	// pendingChanges are the Services changed since the last sync, as
	// kube-proxy's service_changes_pending counts them (five edits of one
	// Service are one pending change).
	pendingChanges  map[types.NamespacedName]struct{}
	servicesSynced  bool
	endpointsSynced bool
	// noPortal: the Services logged as getting no portal, their family
	// having no syncer (family.go).
	noPortal map[types.NamespacedName]bool

	// Owned by the sync: the runner's goroutine, Sync (tests, explain's
	// plan) and SyncFull (tests) and Run's stop, serialised by syncMu.
	syncMu sync.Mutex
	active map[loadbalancer.ServicePortName]*activePort
	// reopening: service ports closed to reopen (closeForReopen) whose
	// new socket has not opened yet. They keep their metric series and
	// lifetime, which are the name's, for the retry; one no longer
	// wanted (its Service deleted meanwhile) is forgotten as closePort
	// forgets an active one.
	reopening map[loadbalancer.ServicePortName]struct{}
	// openTouched: ports opened or closed since the endpoints tracker was
	// last told (setOpen, after a sync that wrote its rules).
	openTouched []loadbalancer.ServicePortName
	// healthPorts are the healthCheckNodePorts in force; healthDirty says
	// the service health server has not been told yet (external.go).
	healthPorts map[types.NamespacedName]int
	healthDirty bool
	// pendingConntrack: service ports with a new proxy socket whose stale
	// conntrack entries wait for a portal sync that writes the rules, with
	// the families whose entries still wait (conntrack.go).
	pendingConntrack map[loadbalancer.ServicePortName]ipFamilies
	// closedUDP: destinations UDP service ports closed or lost, whose
	// entries wait for the same, likewise per family (conntrack.go).
	closedUDP map[netip.AddrPort]ipFamilies
	// retired: external sockets this sync no longer needs, closed once
	// its rules are written (external.go retireExternalSocket).
	retired []retiredSocket
	// policyMoved: UDP service ports of pendingConntrack whose traffic
	// policy changed, with where their external addresses sent clients
	// before, per family (conntrack.go).
	policyMoved map[loadbalancer.ServicePortName]familyMoves
	// lastFull is when the portals last had a full (repairing) sync.
	lastFull time.Time
	// repairAsked: RepairSoon asked for the next sync to be a full one.
	repairAsked atomic.Bool
	// keptPortsRead: the first sync has read the proxy ports the kernel's
	// portals already name (keptports.go).
	keptPortsRead bool
	// failedSyncs counts the syncs in a row that left work undone,
	// failingSince is when the first of them that still fails ran, and
	// lastFailed is what the last one left (sorted; retry.go).
	failedSyncs  int
	failingSince time.Time
	lastFailed   []string
	// debugTouched: the service ports opened, closed or changed since the
	// debug rows were published (publishDebug).
	debugTouched []loadbalancer.ServicePortName
	// debugRebuilds counts the publishes that sorted every row (tests).
	debugRebuilds int

	// listen opens a service port's proxy socket: newProxySocket, or a
	// plan's stand-in that opens nothing.
	listen func(name loadbalancer.ServicePortName, bind netip.Addr, port int, needIPv6 bool, sp *loadbalancer.ServicePort, fp *faults.Port, cfg *socketConfig) (proxySocket, error)

	// debugMu guards the copy of the table that /debug/services reads.
	debugMu sync.RWMutex
	debug   []debugPort
	// debugFailed: the wanted service ports whose socket did not open in
	// the last sync, sorted by key (debug.go).
	debugFailed []debugFailure
}

var _ config.Handler = (*Proxier)(nil)

// New builds a Proxier; call Run to start syncing.
func New(opts Options) *Proxier {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics()
	}
	faultDialer := opts.Dialer
	if opts.Dialer == nil {
		opts.Dialer, faultDialer = backendDialer(opts.Liveness), faultedBackendDialer(opts.Liveness)
	}
	if len(opts.DialTimeouts) > maxDialAttempts {
		opts.DialTimeouts = opts.DialTimeouts[:maxDialAttempts]
	}
	if len(opts.DialTimeouts) == 0 {
		// Empty as nil: no attempt at all left every dial "succeeded"
		// with no backend (TestEmptyDialTimeoutsAreTheDefaults).
		opts.DialTimeouts = defaultDialTimeouts
	}
	if opts.UDPIdleTimeout <= 0 {
		opts.UDPIdleTimeout = 250 * time.Millisecond
	}
	if opts.MinSyncPeriod < 0 || (opts.MinSyncPeriod == 0 && !opts.MinSyncPeriodSet) {
		opts.MinSyncPeriod = time.Second
	}
	if opts.SyncPeriod <= 0 {
		opts.SyncPeriod = 30 * time.Second
	}
	if opts.Faults == nil {
		opts.Faults = faults.NewTable(0, 0, faults.NewMetrics(opts.Metrics.Registry))
	}
	p := &Proxier{
		opts:        opts,
		lb:          loadbalancer.New(opts.Clock, opts.Affinity),
		ports:       newPortAllocator(opts.PortRange, opts.NodePortRange),
		fds:         newDescriptorBudget(),
		metrics:     opts.Metrics,
		clk:         opts.Clock,
		services:    map[types.NamespacedName]*v1.Service{},
		parsed:      map[types.NamespacedName]parsedService{},
		validFaults: map[types.NamespacedName]faultsAnnotation{},
		noPortal:    map[types.NamespacedName]bool{},
		closedUDP:   map[netip.AddrPort]ipFamilies{},
		listen:      newProxySocket,
		active:      map[loadbalancer.ServicePortName]*activePort{},
		reopening:   map[loadbalancer.ServicePortName]struct{}{},
		sockCfg: &socketConfig{
			dialer:           opts.Dialer,
			faultDialer:      faultDialer,
			dialTimeouts:     opts.DialTimeouts,
			udpIdleTimeout:   opts.UDPIdleTimeout,
			halfCloseTimeout: opts.HalfCloseTimeout,
			writeTimeout:     opts.WriteTimeout,
			metrics:          opts.Metrics,
			conns:            &connRegistry{},
			lifetimes:        &lifetimes{},
			closeQuiet:       opts.ConnectionCloseQuiet,
			closeDeadline:    opts.ConnectionCloseDeadline,
			listen:           tcpListenConfig(opts.MultipathTCP, opts.Liveness),
			liveness:         opts.Liveness,
			multipath:        opts.MultipathTCP,
		},
	}
	setDescriptorCeiling()
	p.sockCfg.tcpShares = newTCPShares(opts.TCPMaxConnectionsPerPort)
	p.sockCfg.udpPorts = newSessionPorts(readKernelPortsFromProc, mono.Now())
	var udpLine *logLine
	p.sockCfg.udpMaxSessionsPerPort, p.sockCfg.udpBudget, udpLine = udpLimits(opts, p.sockCfg.udpPorts.count())
	for _, l := range []*logLine{p.sockCfg.tcpShares.startLine(), udpLine} {
		if l != nil {
			p.limitLines = append(p.limitLines, *l)
		}
	}
	p.sockCfg.unreachable = newUnreachableSender()
	p.sockCfg.ownPortals = &ownPortals{}
	for i, s := range []PortalSyncer{opts.IPv4Portals, opts.IPv6Portals} {
		if c, ok := s.(NodePortCapturer); ok {
			p.sockCfg.ownPortals.families[i].nodePorts = c
		}
	}
	if opts.DataPath == DataPathEventLoop {
		p.sockCfg.loops = newLoopGroup(opts)
	}
	opts.Metrics.affinity.observe(p.lb)
	opts.Metrics.ports.observe(p.sockCfg.conns)
	opts.Metrics.portals.observe(opts.IPv4Portals, opts.IPv6Portals)
	p.endpoints = newEndpointsTracker(p.lb, opts.Clock, opts.Metrics, nodeTopology{name: opts.NodeName})
	p.endpoints.changed = p.drainRemoved
	switch p.unsupportedFamily() {
	case ipv4Family:
		p.endpoints.nodeFamilies = familyIPv6
	case ipv6Family:
		p.endpoints.nodeFamilies = familyIPv4
	}
	p.runner = newBoundedFrequencyRunner(p.syncProxyRules, opts.MinSyncPeriod, opts.SyncPeriod, opts.Clock)
	p.sockCfg.deaf = &deafSockets{changed: p.runner.Run}
	if hs, ok := opts.ServiceHealth.(interface {
		UseDescriptors(healthcheck.Descriptors)
	}); ok {
		// Its listeners come out of the sync's budget (syncPolicies).
		hs.UseDescriptors(healthDescriptors{p.fds})
	}
	return p
}

// LoadBalancer exposes the balancer (tests read its state).
func (p *Proxier) LoadBalancer() *loadbalancer.LoadBalancer { return p.lb }

// Run syncs until ctx ends, then closes every proxy socket. The portals
// are left in place on purpose: a restarting proxy keeps its ports and
// rewrites no rule (use --cleanup to remove them). Only their accepts go,
// before the sockets close (stopPortals).
func (p *Proxier) Run(ctx context.Context) {
	go p.sweepAffinity(ctx)
	p.runner.Loop(ctx)
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	flushed := p.stopPortals()
	for name, ap := range p.active {
		if flushed {
			p.closedFlowsToClear(ap)
		}
		p.closePort(name, ap)
	}
	p.closeRetired(bothFamilies)
	// A UDP client that keeps its source port keeps its entry, NATed to a
	// proxy port no socket of ours holds now and that no accept guards:
	// its datagrams reached whoever bound the port, and that process's
	// answers reached it as the service address. Cleared, its next
	// datagram is a new flow, which KUBE-PROXY-PORT-REJECT refuses.
	p.clearStaleFlows(bothFamilies)
	// The live connections end with a reset to both peers: left to the
	// process's exit they got a FIN, and a peer took a stream cut short
	// for a complete one (DESIGN: an abnormal end is a reset, never a FIN).
	p.sockCfg.conns.resetAll()
	if p.sockCfg.loops != nil {
		p.sockCfg.loops.Close() // resets the event loops' connections
	}
	p.sockCfg.unreachable.close()
}

// stopPortals has each family's rules refuse portal traffic from now on
// (PortalStopper), while the sockets still listen: a port is never
// accepted into while no socket of ours holds it. flushed: a family's
// accepts went.
func (p *Proxier) stopPortals() (flushed bool) {
	if p.opts.OtherProxyRunning != nil && p.opts.OtherProxyRunning() {
		// The accepts let the other proxy's traffic in too: its last sync
		// may have written the portals, naming its ports. Flushed, its
		// Services were refused until it repaired the rules.
		klog.InfoS("Another kube-userspace-proxy runs in this network namespace: leaving the accepts of portal traffic to it")
		return
	}
	for _, f := range []struct {
		s      PortalSyncer
		family string
	}{{p.opts.IPv4Portals, ipv4Family}, {p.opts.IPv6Portals, ipv6Family}} {
		st, ok := f.s.(PortalStopper)
		if !ok {
			continue
		}
		if err := st.Stop(); err != nil {
			klog.ErrorS(err, "Failed to flush the accepts of portal traffic: until the next start, a local process that binds a proxy port receives the traffic its portal sends there", "family", f.family)
			continue
		}
		flushed = true
	}
	return flushed
}

func (p *Proxier) sweepAffinity(ctx context.Context) {
	t := p.clk.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			if n := p.lb.Sweep(); n > 0 {
				p.metrics.AffinitySwept.Add(float64(n))
			}
		}
	}
}

func (p *Proxier) queueServiceChange(nn types.NamespacedName) {
	if p.pendingChanges == nil {
		p.pendingChanges = map[types.NamespacedName]struct{}{}
	}
	p.pendingChanges[nn] = struct{}{}
	p.metrics.ServiceChangesTotal.Inc()
	p.metrics.ServiceChangesPending.Set(float64(len(p.pendingChanges)))
	p.metrics.syncQueued()
	if p.opts.Health != nil {
		p.opts.Health.QueuedUpdate()
	}
	if p.servicesSynced && p.endpointsSynced {
		p.runner.Run()
	}
}

func (p *Proxier) OnServiceAdd(svc *v1.Service) { p.OnServiceUpdate(nil, svc) }

func (p *Proxier) OnServiceUpdate(_, svc *v1.Service) {
	p.mu.Lock()
	defer p.mu.Unlock()
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	p.applyFaultsNow(p.services[nn], svc)
	logLifetimeError(p.services[nn], svc)
	logUnknownAnnotations(p.services[nn], svc)
	p.services[nn] = svc
	p.queueServiceChange(nn)
}

func (p *Proxier) OnServiceDelete(svc *v1.Service) {
	p.mu.Lock()
	defer p.mu.Unlock()
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	delete(p.services, nn)
	delete(p.validFaults, nn)
	p.queueServiceChange(nn)
}

func (p *Proxier) OnServiceSynced() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.servicesSynced = true
	if p.endpointsSynced {
		p.runner.Run()
	}
}

func (p *Proxier) OnEndpointSliceAdd(es *discovery.EndpointSlice) { p.endpoints.update(es, false) }
func (p *Proxier) OnEndpointSliceUpdate(old, es *discovery.EndpointSlice) {
	if old != nil && old.Labels[discovery.LabelServiceName] != es.Labels[discovery.LabelServiceName] {
		// Relabelled to another Service: its endpoints leave the old one,
		// which the new slice no longer names (they stayed there until
		// the slice was deleted or a relist).
		p.endpoints.forget(old)
	}
	p.endpoints.update(es, false)
}
func (p *Proxier) OnEndpointSliceDelete(es *discovery.EndpointSlice) { p.endpoints.update(es, true) }

// BeginBatch and EndBatch bracket a burst of events (config.Batcher): the
// slices delivered between them are served, each of their Services merged
// once, when a batch ends.
func (p *Proxier) BeginBatch() { p.endpoints.beginBatch() }
func (p *Proxier) EndBatch()   { p.endpoints.endBatch() }

func (p *Proxier) OnEndpointSlicesSynced() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endpointsSynced = true
	if p.servicesSynced {
		p.runner.Run()
	}
}

// SetNodeZone tells the proxier its node's zone (from the Node object's
// topology.kubernetes.io/zone label), for topology-aware routing.
func (p *Proxier) SetNodeZone(zone string) {
	p.endpoints.setNode(nodeTopology{name: p.opts.NodeName, zone: zone})
}

// Sync runs one sync now, as a change would (portal rules updated
// incrementally unless a full sync is due); for tests and for explain's
// plan (Plan.Run), which must not wait for the rate limiter.
func (p *Proxier) Sync() { p.syncProxyRules(false) }

// SyncFull runs the periodic sync now: portal rules are read back and
// repaired.
func (p *Proxier) SyncFull() { p.syncProxyRules(true) }

// logLine is a line to log later: its message and key/value pairs.
type logLine struct {
	msg string
	kv  []any
}

// LogLimits logs the descriptor caps New set (the TCP connections per
// service port, the UDP sessions held to the open-file limit and the
// ephemeral ports), once, at start. The command calls it after its line
// saying the proxy runs: logged by New, they were the first lines of every
// start, on any machine, before anything said what runs.
func (p *Proxier) LogLimits() {
	for _, l := range p.limitLines {
		klog.InfoS(l.msg, l.kv...)
	}
}

// RepairSoon asks for a full sync, which reads the portal rules back and
// repairs them, as soon as the rate limit allows, rather than at the sync
// period: when another writer of the rules is known to be gone (a proxy
// this one overlapped in a rolling update), whose last sync left them
// naming its ports, and its reset connections' conntrack entries NATed to
// them, which the sync clears (to the service IPs) even when the rules are
// this one's already. Safe from any goroutine.
func (p *Proxier) RepairSoon() {
	p.repairAsked.Store(true)
	p.runner.Run()
}

// parsedService is one Service object and its service ports.
type parsedService struct {
	svc   *v1.Service
	infos []*servicePortInfo
}

// desired returns the service ports of the current Services, and the
// Services whose ports changed since the previous call (their new ports;
// none when removed). A port without a portal in any family the node's
// netfilter supports is left out of both (withPortal). An unchanged Service object keeps its
// *servicePortInfo values, which the sync uses to skip its ports.
func (p *Proxier) desired() (map[loadbalancer.ServicePortName]*servicePortInfo, map[types.NamespacedName][]*servicePortInfo, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := make(map[loadbalancer.ServicePortName]*servicePortInfo, len(p.parsed))
	changed := map[types.NamespacedName][]*servicePortInfo{}
	for nn, svc := range p.services {
		ps, ok := p.parsed[nn]
		if !ok || ps.svc != svc {
			infos := servicePorts(svc)
			p.noteNoPortal(nn, infos)
			ps = parsedService{svc: svc, infos: p.withPortal(infos)}
			p.parsed[nn] = ps
			changed[nn] = ps.infos
		}
		for _, info := range ps.infos {
			want[info.name] = info
		}
	}
	if len(p.parsed) > len(p.services) {
		for nn := range p.parsed {
			if _, ok := p.services[nn]; !ok {
				delete(p.parsed, nn)
				changed[nn] = nil
				p.noteNoPortal(nn, nil)
			}
		}
	}
	n := len(p.pendingChanges)
	clear(p.pendingChanges)
	p.metrics.ServiceChangesPending.Set(0)
	return want, changed, n
}

// syncProxyRules converges sockets, balancer and portal rules to the
// current Services. periodic (the runner's timer) asks for a full portal
// sync, which reads the rules back and repairs drift; so does a sync period
// without one, as constant churn keeps the timer from firing.
func (p *Proxier) syncProxyRules(periodic bool) {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	p.mu.Lock()
	synced := p.servicesSynced && p.endpointsSynced
	p.mu.Unlock()
	if !synced {
		// A partial view would remove the rules of every Service not yet
		// seen (after a restart, all of them): wait for both sources.
		klog.V(2).InfoS("Not syncing: sources have not synced yet")
		return
	}
	start := p.clk.Now()
	otherGone := p.repairAsked.Swap(false)
	full := otherGone || periodic || p.lastFull.IsZero() || p.clk.Since(p.lastFull) >= p.opts.SyncPeriod
	if full {
		p.lastFull = start
	}
	want, changedServices, changes := p.desired()
	// Before a port is handed out or kept: a node port is the proxy's own
	// to hold (NodePorts) or serve (healthCheckNodePorts), never a proxy
	// socket's, whatever --proxy-port-range covers.
	nodePortsChanged := len(changedServices) > 0 && p.ports.setNodePorts(nodePortsOf(want))
	p.fds.begin()
	followDescriptorLimit()
	p.sockCfg.tcpShares.follow(ceilingLimit.Load())
	r := &syncRound{nodePortsChanged: nodePortsChanged}
	if !p.keptPortsRead {
		p.keptPortsRead = true
		r.kept = p.reserveKeptPorts(want)
	}

	if !p.syncPolicies(changedServices) {
		r.failed = append(r.failed, "health check servers")
	}
	p.closeRemoved(want)
	// Every port still active is wanted now, so the rest of want opens (a
	// few more may reopen below: the line count is a threshold, not a tally).
	opening := len(want) - len(p.active)
	r.perPortLines = opening <= servingLinesUpTo
	for name, info := range p.movesLast(want, nodePortsChanged) {
		p.syncPort(r, name, info)
	}
	for _, ap := range r.claimLater {
		if !p.claimPorts(ap) {
			r.failed = append(r.failed, "claim "+ap.info.key)
		}
	}
	// Sockets whose fault port came up but that could not listen again:
	// unserved, and retried, as sockets that did not open.
	for _, s := range p.sockCfg.deaf.list() {
		if s.listenAgainNow() != nil {
			r.failed = append(r.failed, "listen "+s.label)
			r.unserved++
		}
	}
	p.fds.logRefusals()
	p.metrics.ServicePorts.Set(float64(len(p.active)))
	p.metrics.ServicePortsUnserved.Set(float64(r.unserved))
	p.releaseKeptPorts(r.kept)
	if !r.perPortLines {
		klog.InfoS("Serving service ports", "opened", r.opened, "servicePorts", len(p.active), "listenAddress", p.listenHost())
	}

	p.publishDebug()
	p.publishOpenFailures(r.openFailures)
	ok, repaired, failedFamilies := p.syncPortals(full)
	if !ok {
		r.failed = append(r.failed, "portals")
	}
	if repaired || otherGone {
		// The rules replaced (another proxy's, which named its own ports)
		// left entries NATed to ports no socket of ours holds: a UDP
		// client that keeps its source port refreshes its entry with
		// every datagram and stays on the dead port for as long as it
		// sends. Every service port's, as for a new socket. And so when
		// the other proxy is gone though the rules were ours already (a
		// rolling restart: this one wrote last): the connections it
		// reset as it stopped left entries in CLOSE NATed to its ports,
		// through which a client's next connection from the same source
		// port went to the dead port and was refused.
		for name := range p.active {
			p.staleFlowsToClear(name)
		}
	}
	p.retryFailures(r.failed)
	// The families whose rules were written: all of them, or (a family's
	// write failed) those of the others, each going on as kube-proxy's
	// per-family proxiers do.
	written := bothFamilies
	if !ok {
		written = familiesOf(p.syncedFamilies(failedFamilies))
	}
	// Only now do new flows meet the new rules; old flows still point at
	// ports that no longer exist, or at no port at all.
	p.clearStaleFlows(written)
	// Not before their families' rules are written: those of a family
	// whose write failed still send the retired sockets' addresses to
	// them, whose clients were refused until a retry wrote them.
	p.closeRetired(written)
	if len(p.openTouched) > 0 && written != 0 {
		// Ports opened or closed since the last sync that wrote every
		// family's rules: what the programming latency waits for. Kept
		// for the family whose write failed.
		changed := make(map[loadbalancer.ServicePortName]bool, len(p.openTouched))
		for _, name := range p.openTouched {
			changed[name] = p.active[name] != nil
		}
		p.endpoints.setOpen(changed, written)
		if ok {
			p.openTouched = nil
		}
	}
	elapsed := p.clk.Since(start)
	p.metrics.observeSync(elapsed.Seconds(), full, failedFamilies)
	if p.opts.Health != nil {
		// Each family whose rules were written is synced, as each of
		// kube-proxy's per-family proxiers reports its own: a failed
		// ip6tables-restore held back IPv4's last sync time too.
		switch synced := p.syncedFamilies(failedFamilies); {
		case ok:
			p.opts.Health.Updated()
		case len(synced) > 0:
			p.opts.Health.Updated(synced...)
		}
	}
	klog.V(2).InfoS("Synced", "servicePorts", len(p.active), "serviceChanges", changes, "full", full, "elapsed", elapsed)
}

// syncRound is what one sync carries from service port to service port
// and leaves for its end.
type syncRound struct {
	// kept are the proxy ports the kernel's portals name, reserved for
	// their service ports (keptports.go); nil: none.
	kept             *keptPorts
	nodePortsChanged bool
	// perPortLines: each port opened gets a line at the default verbosity
	// (servingLinesUpTo); opened counts them.
	perPortLines bool
	opened       int
	failed       []string // what this sync left undone (retry.go)
	unserved     int      // sockets that did not open, service_ports_unserved
	openFailures []debugFailure
	// claimLater: ports whose held NodePorts and external IP ports
	// change: all are released in the loop and taken after it, so a port
	// that moves from one service port to another in one sync (two ports
	// swapping their NodePorts, a Service taking the NodePort another
	// gave up) is free whichever of them the loop meets first.
	claimLater []*activePort
}

// closeRemoved closes the sockets of the service ports no longer wanted,
// and forgets those closed to reopen that are not wanted any more.
func (p *Proxier) closeRemoved(want map[loadbalancer.ServicePortName]*servicePortInfo) {
	for name, ap := range p.active {
		if _, ok := want[name]; !ok {
			klog.V(1).InfoS("Closing proxy socket of removed service port", "servicePort", name)
			p.closedFlowsToClear(ap)
			p.closePort(name, ap)
			p.forgetRemoved(name)
		}
	}
	for name := range p.reopening {
		if _, ok := want[name]; !ok {
			// Its socket closed to reopen, and did not: nothing else
			// is left of it but what the name keeps.
			p.forgetPort(name)
			p.forgetRemoved(name)
		}
	}
}

// forgetRemoved drops what a removed service port left waiting for a rule
// write. Its retired second socket closes with its own socket: it served
// the removed port's clients of the kernel's old rules (its NodePort,
// external and LB IPs) for as long as the writes failed, where its own
// socket refused the cluster IP's. Its pending clearing and traffic-policy
// move record go (its destinations are cleared as a closed port's,
// closedFlowsToClear): kept while every family's write failed, they
// reached a service port re-created under the same name, whose first
// clearing was judged against the removed one's ports.
func (p *Proxier) forgetRemoved(name loadbalancer.ServicePortName) {
	kept := p.retired[:0]
	for _, r := range p.retired {
		if r.svc != name {
			kept = append(kept, r)
			continue
		}
		_ = r.sock.Close()
		p.ports.Release(r.port)
		p.lb.DeleteServicePort(externalName(name))
	}
	clear(p.retired[len(kept):])
	p.retired = kept
	delete(p.pendingConntrack, name)
	delete(p.policyMoved, name)
}

// syncPort brings the sockets, balancer entries, faults, lifetime and
// NodePort claims of one wanted service port in line with info.
func (p *Proxier) syncPort(r *syncRound, name loadbalancer.ServicePortName, info *servicePortInfo) {
	ap := p.active[name]
	// A socket on a port that became a node port moves off it, onto
	// a port the range has free once the sync's new service ports
	// have theirs; with none, it stays (closed first, it was lost).
	onNodePort := r.nodePortsChanged && ap != nil && p.onNodePort(ap) && p.canMove(name, ap)
	if ap != nil && ap.info == info && !ap.claimsMissing && !onNodePort && (ap.external != nil || !info.policy.splitExternal()) {
		return // the same Service object as last sync, and nothing to retry
	}
	if ap != nil && ap.info != info {
		// Before a reopen, which forgets the old info.
		p.removedFlowsToClear(ap.info, info)
		if ap.info.policy != info.policy {
			// Before a reopen too (which keeps the ports), and before
			// its external socket opens or closes.
			p.policyChanged(ap)
		}
		if gained := info.serviceFamilies() &^ ap.info.serviceFamilies(); gained != 0 {
			// Served in a family it was not (an IPv6 address added):
			// no rule of that family names its socket until a sync
			// writes them, so its programming latency there waits
			// for them (setOpen); the open flag of that family, set
			// while it had nothing to write there, said it was in.
			p.endpoints.moved(name)
			p.openTouched = append(p.openTouched, name)
		}
	}
	if ap != nil && (ap.info.hasIPv6() != info.hasIPv6() || ap.info.faultName != info.faultName || onNodePort) {
		// The socket's address family must change, or its fault port
		// is renamed (an unnamed port's number is in the name, and the
		// socket holds its fault port): reopen it, as a fresh proxier
		// would open it. Else the fault API kept the old name and the
		// port left the fault table only at its next change.
		// Under the same name the fault port stays: a new family
		// (an IPv6 address added, even by a cloud controller's
		// status update) must not end a fault experiment, nor bring
		// a port the API set down back up. The service port is the
		// same: it keeps its balancer state and its proxy ports, but
		// for one that is now a node port (closeForReopen).
		r.kept = p.closeForReopen(r.kept, name, ap, info)
		ap = nil
	}
	if ap == nil {
		var err error
		if ap, err = p.openPort(info, r.kept.claim(info), r.kept.claimSuccession(info), r.perPortLines); err != nil {
			// Tried again by the retry (retry.go); the port was released.
			if p.fds.logged(err) {
				klog.ErrorS(err, "Failed to open proxy socket", "servicePort", name)
			}
			r.failed = append(r.failed, "open "+info.key)
			r.unserved++
			r.openFailures = append(r.openFailures, debugFailure{name: name, info: info, err: err.Error()})
			return
		}
		r.opened++
		p.active[name] = ap
		delete(p.reopening, name)
		if p.opts.ClaimNodePorts {
			r.claimLater = append(r.claimLater, ap)
		}
		p.openTouched = append(p.openTouched, name)
		p.debugTouched = append(p.debugTouched, name)
		p.staleFlowsToClear(name)
	}
	if ap.info.affinity != info.affinity || ap.info.dualStack != info.dualStack {
		p.setBalancerPolicy(name, info)
		if ap.external != nil {
			p.setBalancerPolicy(externalName(name), info)
		}
	}
	p.syncFaults(ap, info)
	p.syncLifetime(info)
	if !p.syncExternalSocket(ap, info, r.kept, r.perPortLines) {
		r.failed = append(r.failed, "open external "+info.key)
		r.unserved++
	}
	if !ap.info.sameRules(info) {
		// New destinations (a NodePort, an external IP) may hold
		// entries of datagrams sent before their portal existed, and
		// a closed external socket leaves entries NATed to its port:
		// either keeps a client that reuses its source port off the
		// portal for as long as it keeps sending.
		p.staleFlowsToClear(name)
		if p.opts.ClaimNodePorts {
			p.releaseClaims(ap)
			r.claimLater = append(r.claimLater, ap)
		}
	} else if ap.claimsMissing {
		p.releaseClaims(ap)
		r.claimLater = append(r.claimLater, ap)
	}
	if ap.info != info {
		p.debugTouched = append(p.debugTouched, name)
		ap.info = info
		p.setFaultListen(ap, info) // a ClusterIP or port changed in place
	}
}

// setBalancerPolicy hands the balancer entry name the Service's side of
// info: its session affinity, and whether its families are kept apart.
func (p *Proxier) setBalancerPolicy(name loadbalancer.ServicePortName, info *servicePortInfo) {
	p.lb.SetAffinity(name, info.affinity)
	p.lb.SetFamiliesApart(name, info.dualStack)
}

// servingLinesUpTo is how many ports one sync may open with a line each at
// the default verbosity; a sync that opens more (a first start, a big
// namespace created) logs one line for all and each at -v=2: 10,000 lines
// cost a first sync 41 ms of CPU in formatting alone, and bury the rest.
const servingLinesUpTo = 100

// setFaultListen shows the fault API the address of ap's Service port
// info (faultListen), and tells it the proxy socket, which it takes back
// as listen too.
func (p *Proxier) setFaultListen(ap *activePort, info *servicePortInfo) {
	proxyAddr := net.JoinHostPort(p.listenHostOf(info), strconv.Itoa(ap.proxyPort))
	ap.faults.SetAddresses(p.faultListen(info, proxyAddr), "")
	ap.faults.SetSocket(proxyAddr)
}

// faultListen is what the fault API shows as the listen address of the
// port info, whose proxy socket is at proxyAddr: where a Toxiproxy test
// dials the proxy. With portals, the Service's first ClusterIP of a family
// that has them: a connection straight to a proxy socket is dropped by the
// port guard (KUBE-PROXY-PORT-GUARD), from the node too, and a test that
// dialled the socket's address hung until its dial timeout; the ClusterIP
// reaches the same socket through its portal. Without portals, the socket.
func (p *Proxier) faultListen(info *servicePortInfo, proxyAddr string) string {
	for _, ip := range info.clusterIPs {
		if ip.Is4() && p.opts.IPv4Portals != nil || ip.Is6() && p.opts.IPv6Portals != nil {
			return netip.AddrPortFrom(ip, uint16(info.port)).String()
		}
	}
	return proxyAddr
}

// openPort opens info's proxy socket, on port kept when it can (a port
// reserved for it, keptports.go; 0: any), succeeding the socket a reopen
// set aside (succ, nil for none: closed as the new one binds, its UDP
// sessions adopted); logLine: say so at the default verbosity (else at
// -v=2).
func (p *Proxier) openPort(info *servicePortInfo, kept int, succ *succession, logLine bool) (*activePort, error) {
	sp := p.lb.ServicePort(info.name)
	p.setBalancerPolicy(info.name, info)
	fp := p.opts.Faults.PortLabeled(info.faultName, string(info.name.Protocol), info.key)
	bind := p.listenAddrOf(info)
	listen := func(port int) (proxySocket, error) {
		succ.closeOld()
		return p.listen(info.name, bind, port, bind.Is6(), sp, fp, p.sockCfg)
	}
	sock, err := p.openSocket(kept, listen)
	if err != nil {
		// Not serving: the retry calls ServicePort again. Left marked as a
		// Service, the entry and its affinity table outlived a Service
		// deleted before any retry succeeded.
		p.opts.Faults.RemovePort(info.faultName)
		p.lb.DeleteServicePort(info.name)
		// A socket that was reopening kept its external entry too.
		p.lb.DeleteServicePort(externalName(info.name))
		succ.abandon()
		return nil, err
	}
	succ.adoptBy(sock) // before Start: no session of its own yet
	sock.Start()
	p.movedOffKept(info, kept, sock.Port())
	ap := &activePort{info: info, socket: sock, proxyPort: sock.Port(), faults: fp}
	fp.SetLabel(info.key) // a port the fault API created first has the API name
	p.setFaultListen(ap, info)
	fp.SetUpstreamFunc(func() string { return p.upstreamOf(info.name) })
	if logLine || klog.V(2).Enabled() {
		klog.InfoS("Serving service port", "servicePort", info.name, "protocol", info.name.Protocol,
			"proxyAddress", net.JoinHostPort(p.listenHostOf(info), strconv.Itoa(ap.proxyPort)))
	}
	return ap, nil
}

// openSocket opens a proxy socket on the kept port if it can, else on one
// the allocator picks, within the sync's descriptor budget.
func (p *Proxier) openSocket(kept int, listen func(port int) (proxySocket, error)) (proxySocket, error) {
	if err := p.fds.take(); err != nil {
		return nil, err
	}
	sock, err := p.ports.OpenPreferred(kept, listen)
	if err != nil {
		p.fds.giveBack()
	}
	return sock, err
}

// movedOffKept says when a port the kernel's rules name for a service
// port (kept) could not be opened again, another process holding it: its
// clients are refused or reach that process until a sync rewrites the
// rules for the new one, in each family (so the endpoints tracker, for the
// programming latency, counts it open in none until then).
func (p *Proxier) movedOffKept(info *servicePortInfo, kept, port int) {
	if kept > 0 && port != kept {
		p.endpoints.moved(info.name)
		klog.InfoS("Proxy port taken by another process; the service port moves to a new one and its rules are rewritten",
			"servicePort", info.name, "protocol", info.name.Protocol, "keptPort", kept, "proxyPort", port)
	}
}

func (p *Proxier) closePort(name loadbalancer.ServicePortName, ap *activePort) {
	if err := ap.socket.Close(); err != nil {
		klog.ErrorS(err, "Closing proxy socket", "servicePort", name)
	}
	p.ports.Release(ap.proxyPort)
	p.closeExternalSocket(ap)
	p.releaseClaims(ap)
	p.lb.DeleteServicePort(name)
	p.opts.Faults.RemovePort(ap.info.faultName)
	p.forgetPort(name)
	delete(p.active, name)
	p.openTouched = append(p.openTouched, name)
	p.debugTouched = append(p.debugTouched, name)
}

// forgetPort drops what the service port's name keeps across a reopen:
// its connection lifetime and its metric series.
func (p *Proxier) forgetPort(name loadbalancer.ServicePortName) {
	p.sockCfg.lifetimes.remove(name)
	p.metrics.forgetServicePort(name.String())
	delete(p.reopening, name)
}

// nodePortsOf is the node ports of the service ports of want: their
// NodePorts and healthCheckNodePorts.
func nodePortsOf(want map[loadbalancer.ServicePortName]*servicePortInfo) map[int]bool {
	ports := map[int]bool{}
	for _, info := range want {
		for _, port := range []int{info.nodePort, info.healthCheckNodePort} {
			if port != 0 {
				ports[port] = true
			}
		}
	}
	return ports
}
