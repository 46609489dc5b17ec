package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	faultapi "github.com/kube-userspace-proxy/kube-userspace-proxy/faults/api"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/httpserver"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/netaddr"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/healthcheck"
)

// source is what feeds the proxier: manifests or an API server.
type source interface {
	Run(ctx context.Context) error
}

// started is told the proxier and the servers' addresses once they run;
// the demo uses it, main passes nil.
type started func(p *proxier.Proxier, metricsAddr string)

// run wires source → proxier → sockets + rules and serves until ctx ends.
func run(ctx context.Context, o *options, v *validated, onStart started) error {
	began := time.Now() // --state-file-grace counts from here
	// One client for the Node's read, the events and the informers.
	var client kubernetes.Interface
	if o.manifests == "" {
		var err error
		if client, err = apiClient(o); err != nil {
			return err
		}
		readNodeObjectIPs(ctx, client, o, v, isLocalAddress)
	}
	resolveNodePortAddresses(v)
	warnBindAddressNotLocal(v.bind, isLocalAddress)
	warnProxyPortsOverNodePorts(v.portRange, v.nodePorts)
	clk := clock.RealClock{}
	metrics := proxier.NewMetrics()
	health := healthcheck.NewProxierHealth(clk, healthTimeout(o.syncPeriod))
	faultTable := faults.NewTable(o.faultSeed, o.faultMaxActive, faults.NewMetrics(metrics.Registry))
	faultTable.SetMaxBufferedBytes(o.faultMaxBuffered)
	// Only the API can take a port down and cut its live connections, so
	// only then is every connection tracked.
	faultTable.TrackLive = o.faultAPIBind != ""

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
	if !o.udpMaxPerPortGiven {
		popts.UDPMaxSessionsPerPort = 0 // the default, which the descriptor limit scales
	}
	// The families /healthz reports: a specific --bind-address's, else
	// both; with rules, those the node has syncers for.
	ipv4, ipv6 := true, true
	if family, ok := bindFamily(v); ok {
		ipv4, ipv6 = family == iptables.IPv4, family == iptables.IPv6
	}
	otherGone := func(func()) {} // claim.OnOtherGone with rules to repair
	if o.iptables {
		if !canProgramIptables() {
			return errNoNetAdmin
		}
		claim, held, other := claimInstance()
		defer claim.release()
		otherGone = claim.OnOtherGone
		if held {
			klog.ErrorS(nil, "Another kube-userspace-proxy is running in this network namespace: the two rewrite each other's portal rules, so Services fail by turns; stop one, or run this one with --iptables=false", "pid", pidValue(other))
		}
		v4, v6, err := portalSyncers(ctx, v, iptables.NewRunner)
		if ctx.Err() != nil {
			return nil // stopped while the probe waited out a held lock: nothing set up yet
		}
		if err != nil {
			return err
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
	health.SetFamilies(servedFamilies(ipv4, ipv6)...)
	metrics.SetFamilies(servedFamilies(ipv4, ipv6)...)
	var p *proxier.Proxier
	// Where NodePorts answer (--nodeport-addresses), as kube-proxy: not on
	// --bind-address, which is the proxy sockets' address.
	serviceHealth := healthcheck.NewServiceHealthServer(v.nodePortAddresses, o.httpLimits(), func(nn types.NamespacedName) int { return p.LocalEndpoints(nn) },
		func() bool { ok, _ := health.Healthy(); return ok })
	defer serviceHealth.Close()
	popts.ServiceHealth = serviceHealth
	p = proxier.New(popts)
	otherGone(p.RepairSoon)

	if o.manifests == "" {
		registerRESTClientMetrics(metrics.Registry)
	}
	var h config.Handler = p
	nodeIPsErr := make(chan error, 1)
	var restart func(error)
	if o.iptables {
		restart = func(err error) { // the first of the watches to ask is told
			select {
			case nodeIPsErr <- err:
			default:
			}
		}
	}
	var nodes config.NodeHandler = nodeState{health, p, newNodeIPsWatch(v, isLocalAddress, restart), new(atomic.Bool)}
	var lastState *config.LastKnownState
	if o.stateFile != "" {
		lastState = config.NewLastKnownState(o.stateFile, p, o.stateFileGrace)
		lastState.GraceFrom(began)
		registerLastKnownStateMetrics(metrics.Registry, lastState)
		h, nodes = lastState, lastState.Nodes(nodeName(o.hostnameOverride), nodes)
	}
	src, err := newSource(o, v, client, h, nodes)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var events *nodeEvents
	if client != nil {
		events = startNodeEvents(ctx, client, nodeName(o.hostnameOverride))
		serviceHealth.ListenFailed = events.healthCheckFailed
	}
	servers, metricsAddr, err := startServers(ctx, o, p, health, metrics, faultTable)
	if err != nil {
		return err
	}
	defer func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}()

	if o.iptables {
		go newRouteIPsWatch(v, isLocalAddress, restart).run(ctx, routeIPsInterval)
	}
	srcErr := make(chan error, 1)
	go func() { srcErr <- src.Run(ctx) }()
	// proxierDone also waits for the last known state's last write, made
	// when ctx ends.
	proxierDone := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		if lastState != nil {
			wg.Go(func() { lastState.Run(ctx) })
		}
		p.Run(ctx)
		wg.Wait()
		close(proxierDone)
	}()
	if onStart != nil {
		onStart(p, metricsAddr)
	}
	shownMetrics := metricsAddr
	if shownMetrics == "" && o.metricsBindAddress != "" {
		// Its port is taken and retried (startServers): "" read as none.
		shownMetrics = o.metricsBindAddress + " (not bound yet; retrying)"
	}
	klog.InfoS("kube-userspace-proxy running", "mode", "userspace", "iptables", o.iptables, "bindAddress", v.bind, "metrics", shownMetrics)
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
	case err = <-nodeIPsErr:
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
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	return client, nil
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

// portalSyncers builds one rule syncer per IP family the node can program,
// each on the runner newRunner returns (iptables.NewRunner; tests pass
// fakes). Each family is probed here, as kube-proxy does at start
// (iptables.Present). IPv6 is optional: a node without ip6tables, or whose
// kernel has no IPv6 nat table, serves IPv4 only; it is said once here,
// where a syncer for it failed every sync and kept /healthz unready. An
// xtables lock another process holds says nothing of either (probeFamily).
func portalSyncers(ctx context.Context, v *validated, newRunner func(iptables.Family) (iptables.Runner, error)) (proxier.PortalSyncer, proxier.PortalSyncer, error) {
	cfg, cfg6, nodeIPs := portalConfigs(v)
	// One wait for both families: two full waits outlived the liveness
	// probe.
	deadline := time.Now().Add(lockWait)
	r4, waited, err := probeFamily(ctx, iptables.IPv4, newRunner, deadline)
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	if iptables.IsLockHeld(err) {
		// Not a node without iptables, nor a lack of privileges: another
		// process (a CNI, a firewall) keeps the lock; a restart retries.
		return nil, nil, fmt.Errorf("iptables: the xtables lock is held by another process (waited %v for it): %s", waited.Round(time.Second), strings.TrimSpace(err.Error()))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("iptables: %w (run as root with iptables installed, or use --iptables=false)", err)
	}
	var v4, v6 proxier.PortalSyncer
	iptables.WarnOtherBackend(r4)
	v4 = iptables.New(r4, cfg)
	r6, waited, err := probeFamily(ctx, iptables.IPv6, newRunner, deadline)
	if ctx.Err() != nil {
		// Stopped during the wait: nothing more to set up (no IPv6 verdict
		// to log, no other family's rules to clean under a held lock).
		return nil, nil, ctx.Err()
	}
	r6Locked := iptables.IsLockHeld(err) && r6 != nil
	if r6Locked {
		// ip6tables runs: only the lock kept it from answering. Taken as
		// absent, IPv6 stayed off until a restart, its Services refused
		// and the last run's portals sending them to closed ports.
		klog.InfoS("The xtables lock is still held by another process: IPv6 is served and its syncs retry until the lock frees", "waited", waited.Round(time.Second), "reason", err)
		err = nil
	}
	if err != nil {
		klog.InfoS("No iptables support for family: its Services get no portals", "ipFamily", "IPv6", "reason", err)
		r6 = nil
	} else {
		iptables.WarnOtherBackend(r6)
		v6 = iptables.New(r6, cfg6)
	}
	if family, ok := bindFamily(v); ok {
		// Proxy sockets on one address of one family cannot take the other
		// family's traffic: portals of that family led to refused
		// connections (and REDIRECTed to a port nothing listened on).
		// Served as on a node without that family's netfilter.
		other, otherRunner := "IPv6", r6
		if family == iptables.IPv6 {
			other, otherRunner, v4 = "IPv4", r4, nil
		} else {
			v6 = nil
		}
		klog.InfoS("--bind-address names one address: the other family's Services get no portals (dual-stack ones are served in its family)",
			"bindAddress", v.bind, "ipFamily", other)
		if otherRunner != nil {
			// A proxy that ran here before with both families left that
			// family's portals, which no syncer of this one repairs: they
			// sent its clients to proxy ports nothing of ours listens on
			// (another process's, once).
			cleanup := func() {
				if err := iptables.Cleanup(otherRunner); err != nil {
					klog.ErrorS(err, "Removing the rules a previous run left in the family --bind-address does not serve", "ipFamily", other)
				}
			}
			if family == iptables.IPv4 && r6Locked {
				// In the background: under the held lock Cleanup asks
				// again for about a minute, which held start-up (and
				// /livez) past the liveness probe; no syncer of ours
				// touches that family.
				go cleanup()
			} else {
				cleanup()
			}
		}
	}
	if v.nodeIP.IsValid() && !isLocalAddress(v.nodeIP) {
		klog.InfoS("Warning: --node-ip is not an address of this node's interfaces: portal traffic DNATed to it leaves the node instead of reaching the proxy", "nodeIP", v.nodeIP)
	}
	// Each family's with rules: the IPv6 portals DNAT to the IPv6 one
	// (one address was named, whichever family it was).
	nodeIPs = slices.DeleteFunc(nodeIPs, func(ip netip.Addr) bool { return ip.Is4() && v4 == nil || ip.Is6() && v6 == nil })
	// A family with rules but no node IP (no default route, no --node-ip,
	// no Node address) has portals that REDIRECT (to the address a packet
	// arrived on), or DNAT to --bind-address when it names one, instead of
	// DNAT to a node IP. Said per family: a dual-stack node missing one
	// family's said nothing of it.
	var without []string
	for _, f := range []struct {
		name   string
		served bool
		six    bool
	}{{"IPv4", v4 != nil, false}, {"IPv6", v6 != nil, true}} {
		if f.served && !slices.ContainsFunc(nodeIPs, func(ip netip.Addr) bool { return ip.Is6() == f.six }) {
			without = append(without, f.name)
		}
	}
	switch {
	case len(without) == 0:
		klog.InfoS("Portal rules enabled", "nodeIPs", nodeIPs)
	case len(nodeIPs) == 0:
		klog.InfoS("Portal rules enabled; no node IP (no default route, no --node-ip): portals REDIRECT, or DNAT to --bind-address when it names an address")
	default:
		klog.InfoS("Portal rules enabled; some families have no node IP (no default route, no --node-ip): their portals REDIRECT, or DNAT to --bind-address when it names an address", "nodeIPs", nodeIPs, "withoutNodeIP", without)
	}
	if i := slices.IndexFunc(nodeIPs, iptables.LinkScoped); i >= 0 && (!v.bind.IsValid() || v.bind.IsUnspecified()) {
		// Local on its own link only: other links' traffic DNATed to it
		// would be routed out again (iptables.Rules.containerTarget,
		// hostTarget).
		klog.InfoS("The IPv6 node IP is link-local: traffic from pods and other hosts is REDIRECTed to the address it arrived on, the node's own to the loopback address", "nodeIP", nodeIPs[i])
	}
	return v4, v6, nil
}

// lockWait bounds how long start-up waits out an xtables lock another
// process holds, trying again every lockRetryInterval (each try itself
// waits 5 s for the lock, iptables -w 5): about 25 s at most per family,
// within the shipped DaemonSet's liveness probe (which kills the
// container at about 40 s: /livez is served only after this), so the
// clear error below is what the log shows, not a kill. 60 s never got
// that far.
var lockWait, lockRetryInterval = 20 * time.Second, 2 * time.Second

// probeFamily returns f's runner and whether the family can hold our
// rules (iptables.Present), trying again while the xtables lock is held
// by another process, for up to lockWait: a lock held at the wrong moment
// is no answer about the family.
// It also returns how long it waited. It waits no longer than deadline.
func probeFamily(ctx context.Context, f iptables.Family, newRunner func(iptables.Family) (iptables.Runner, error), deadline time.Time) (iptables.Runner, time.Duration, error) {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		r, err := newRunner(f)
		if err == nil {
			err = iptables.Present(r)
		}
		if !iptables.IsLockHeld(err) || !time.Now().Before(deadline) {
			return r, time.Since(start), err
		}
		klog.InfoS("The xtables lock is held by another process: waiting for it to probe the family's iptables", "ipFamily", f, "attempt", attempt, "waited", time.Since(start).Round(time.Second), "giveUpAfter", lockWait)
		select {
		case <-ctx.Done():
			return r, time.Since(start), err
		case <-time.After(lockRetryInterval):
		}
	}
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

// kube-proxy's --nodeport-addresses keywords: the node's primary IPs, the
// loopback CIDRs and every address.
const (
	nodePortAddressesPrimary   = "primary"
	nodePortAddressesLocalhost = "localhost"
	nodePortAddressesAll       = "all"
)

// nodePortKeywordCIDRs are the CIDRs of localhost and all, as kube-proxy's
// expandNodePortAddressKeywords writes them.
var nodePortKeywordCIDRs = map[string][]netip.Prefix{
	nodePortAddressesLocalhost: {netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
	nodePortAddressesAll:       {netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
}

// resolveNodePortAddresses adds for --nodeport-addresses primary each
// family's primary node IP as a single-address CIDR to the list's other
// CIDRs, as kube-proxy does at start (expandNodePortAddressKeywords), for
// the NodePort portals and the healthCheckNodePort servers alike. The
// primary IP is --node-ip, else the default-route address: not
// --bind-address, which is where proxy sockets listen. It was the bind
// address, so a loopback one (the README's first run) left NodePorts on
// every address, and an IPv4 one left IPv6 unrestricted. A family with
// neither is skipped, as kube-proxy skips a family whose node IP it could
// not find (loopback): a family without CIDRs of its own is not limited,
// there as here.
//
// A family with a /0 (all, 0.0.0.0/0, ::/0) takes every address: its
// CIDRs are dropped, which says the same (a family without CIDRs is not
// limited) in rules iptables-save prints back as written (it prints no
// "-d 0.0.0.0/0", so each start's first periodic sync "repaired" them).
func resolveNodePortAddresses(v *validated) {
	primary := v.nodePortPrimary
	v.nodePortPrimary = false
	if primary {
		for _, f := range []struct {
			six   bool
			route func() netip.Addr
		}{{false, defaultRoutes.v4}, {true, defaultRoutes.v6}} {
			ip := v.nodeIP
			if !ip.IsValid() || ip.Is4() == f.six {
				ip = hostIPOf(v, f.six, f.route)
			}
			if ip.IsValid() && !ip.IsLoopback() {
				v.nodePortAddresses = append(v.nodePortAddresses, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	everyAddress := map[bool]bool{}
	for _, p := range v.nodePortAddresses {
		if p.Bits() == 0 {
			everyAddress[p.Addr().Is4()] = true
		}
	}
	v.nodePortAddresses = slices.DeleteFunc(v.nodePortAddresses, func(p netip.Prefix) bool { return everyAddress[p.Addr().Is4()] })
	if !primary {
		return
	}
	var unrestricted []string
	for _, f := range []struct {
		name string
		four bool
	}{{"IPv4", true}, {"IPv6", false}} {
		if !slices.ContainsFunc(v.nodePortAddresses, func(p netip.Prefix) bool { return p.Addr().Is4() == f.four }) {
			unrestricted = append(unrestricted, f.name)
		}
	}
	if len(unrestricted) > 0 {
		klog.InfoS("NodePorts answer on the node's primary IPs and the other --nodeport-addresses; a family without any (no --node-ip, no default route, or a /0) is not restricted, as in kube-proxy",
			"addresses", v.nodePortAddresses, "unrestricted", unrestricted)
	} else {
		klog.InfoS("NodePorts answer on the node's primary IPs and the other --nodeport-addresses", "addresses", v.nodePortAddresses)
	}
}

// bindFamily is the family of a --bind-address that names one address,
// false for 0.0.0.0 and ::, which take both families.
func bindFamily(v *validated) (iptables.Family, bool) {
	if !v.bind.IsValid() || v.bind.IsUnspecified() {
		return 0, false
	}
	if v.bind.Unmap().Is4() {
		return iptables.IPv4, true
	}
	return iptables.IPv6, true
}

// portalConfigs is how the flags shape each family's rules (the proxy and
// explain alike): where proxy sockets listen, the node IP of each family
// that traffic is DNATed to (nodeIPOf), and --nodeport-addresses. nodeIP
// is the one to report: --node-ip, else the IPv4 one, else the IPv6 one.
func portalConfigs(v *validated) (cfg4, cfg6 iptables.Config, nodeIPs []netip.Addr) {
	cfg4 = iptables.Config{Family: iptables.IPv4, NodePortAddresses: v.nodePortAddresses, PreroutingRedirect: v.preroutingRedirect, ClusterCIDRs: v.clusterCIDRs}
	if v.bind.Is4() {
		cfg4.BindAddress = v.bind
	}
	cfg4.NodeIP = nodeIPOf(v, false, defaultRoutes.v4)
	cfg6 = iptables.Config{Family: iptables.IPv6, NodePortAddresses: v.nodePortAddresses, PreroutingRedirect: v.preroutingRedirect, ClusterCIDRs: v.clusterCIDRs}
	if v.bind.Is6() {
		cfg6.BindAddress = v.bind
	}
	cfg6.NodeIP = nodeIPOf(v, true, defaultRoutes.v6)
	for _, ip := range []netip.Addr{cfg4.NodeIP, cfg6.NodeIP} {
		if ip.IsValid() {
			nodeIPs = append(nodeIPs, ip)
		}
	}
	return cfg4, cfg6, nodeIPs
}

// nodeIPOf is one family's node IP: --node-ip when it is of that family,
// else a specific --bind-address of that family, else (neither flag names
// an address of the family) the address of that family's default-route
// interface. An IPv6 --node-ip used to leave IPv4 without a node IP, and
// IPv6 never had one: its portals fell back to REDIRECT.
func nodeIPOf(v *validated, six bool, fromRoute func() netip.Addr) netip.Addr {
	ofFamily := func(a netip.Addr) bool { return a.IsValid() && !a.IsUnspecified() && a.Unmap().Is4() != six }
	switch {
	case ofFamily(v.nodeIP):
		return v.nodeIP.Unmap()
	case ofFamily(v.bind):
		return v.bind.Unmap()
	case v.bind.IsValid() && !v.bind.IsUnspecified():
		return netip.Addr{} // sockets listen on one address of the other family
	}
	return hostIPOf(v, six, fromRoute)
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

// isLocalAddress reports whether ip is an address of one of the node's
// interfaces (true when they cannot be listed: no warning then).
func isLocalAddress(ip netip.Addr) bool {
	local, err := netaddr.IsLocal(ip)
	return local || err != nil
}

// cleanupRules is --cleanup's work (a variable: tests must not run it on
// the host).
var cleanupRules = iptables.CleanupAll

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
			klog.InfoS("Health server listening", "address", addr)
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
			klog.InfoS("Fault API (Toxiproxy's REST API) listening", "address", addr)
		}
	}
	return servers, metricsAddr, nil
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
		klog.InfoS("Server listening after retrying", "flag", flag, "address", bound)
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

// defaultRoutes find each family's default-route address, for the node
// IPs of the portals and NodePorts (run and explain alike); explain's tests
// replace them to explain a node without a default route.
var defaultRoutes = struct{ v4, v6 func() netip.Addr }{defaultRouteIP, defaultRouteIP6}

// defaultRouteIP is the IPv4 address this node sends from on its default
// route: the address other hosts reach it on, and so the DNAT target for
// the node's own service traffic. It is the kernel's choice (routeSource),
// else the first address of the route's interface.
func defaultRouteIP() netip.Addr {
	data, err := os.ReadFile("/proc/thread-self/net/route")
	if err != nil {
		return netip.Addr{}
	}
	return defaultRouteSource(parseDefaultRouteInterface(string(data)), false)
}

// defaultRouteIP6 is defaultRouteIP for IPv6: a global address, or none.
func defaultRouteIP6() netip.Addr {
	data, err := os.ReadFile("/proc/thread-self/net/ipv6_route")
	if err != nil {
		return netip.Addr{}
	}
	return defaultRouteSource(parseDefaultRoute6Interface(string(data)), true)
}

// defaultRouteSource is the source address of the default route on
// ifname, "" for none: what the kernel picks, else ifname's first address.
// The first address alone was wrong on three node shapes: a VIP (a
// keepalived /32) listed before the node's address, gone when the VIP
// moved; a deprecated IPv6 address (preferred_lft 0), gone when it
// expired; and a routed node whose address is on lo with the route's
// `src` naming it (unnumbered uplinks), where there was none at all.
func defaultRouteSource(ifname string, six bool) netip.Addr {
	if ifname == "" {
		return netip.Addr{}
	}
	if a := routeSource(six); a.IsValid() {
		return a
	}
	return interfaceAddr(ifname, six)
}

// routeProbe stands for "any other host": a documentation address
// (RFC 5737, RFC 3849), which no node has a route of its own for, so the
// lookup takes the default route.
var routeProbe = struct{ v4, v6 string }{"192.0.2.1:9", "[2001:db8::1]:9"}

// routeSource asks the kernel which address it would send from to
// routeProbe: the default route's `src`, else its source selection (the
// address on the gateway's subnet, not a deprecated IPv6 one). A UDP
// connect only looks the route up: nothing is sent.
func routeSource(six bool) netip.Addr {
	network, probe := "udp4", routeProbe.v4
	var d net.Dialer
	if six {
		network, probe = "udp6", routeProbe.v6
		d.Control = preferPublicSource
	}
	c, err := d.Dial(network, probe)
	if err != nil {
		return netip.Addr{}
	}
	defer c.Close()
	ap, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil {
		return netip.Addr{}
	}
	a := ap.Addr().Unmap()
	if a.Is4() == six || a.IsLoopback() || a.IsUnspecified() || (six && !a.IsGlobalUnicast()) {
		return netip.Addr{}
	}
	return a
}

// ipv6PreferSrcPublic is linux/in6.h's IPV6_PREFER_SRC_PUBLIC (RFC 5014),
// which x/sys does not name.
const ipv6PreferSrcPublic = 0x0002

// preferPublicSource makes an IPv6 socket's source selection prefer a
// stable address to an RFC 4941 temporary one (use_tempaddr 2 prefers the
// temporary one): a privacy address is deprecated within a day and gone
// within a week, and a node IP taken from it restarted the proxy as it went.
func preferPublicSource(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_ADDR_PREFERENCES, ipv6PreferSrcPublic)
	}); err != nil {
		return err
	}
	if serr != nil {
		klog.V(2).InfoS("Could not ask for a stable IPv6 source address; the kernel's default choice stands", "err", serr)
	}
	return nil
}

// interfaceAddr returns the first address of one family on ifname; for
// IPv6 a global one (a link-local address needs a zone, which rules cannot
// carry).
func interfaceAddr(ifname string, six bool) netip.Addr {
	if ifname == "" {
		return netip.Addr{}
	}
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return netip.Addr{}
	}
	addrs, _ := ifc.Addrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if ip.Is4() != six && (!six || ip.IsGlobalUnicast()) {
				return ip
			}
		}
	}
	return netip.Addr{}
}
