package main

import (
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// validate checks every option and parses those the proxier takes in its
// own types. It reports every mistake at once, one per line, each naming
// its flag (and the --config field that set it), so an operator fixes a
// command line in one go.
func (o *options) validate() (*validated, error) {
	v := &validated{preroutingRedirect: o.preroutingRedirect}
	var errs []string
	add := func(format string, args ...any) { errs = append(errs, o.blameConfigFile(fmt.Sprintf(format, args...))) }
	for _, e := range o.configFieldErrors {
		add("--config %s: %s", o.configFile, e)
	}
	o.validateDataPath(add)
	o.validateProxySockets(v, add)
	o.validateNodeName(add)
	o.validateUDP(add)
	o.validateSyncPeriods(add)
	o.validateAPIClient(add)
	o.validateStateFile(add)
	o.validateTCPTimeouts(add)
	o.validateNodePortAddresses(v, add)
	o.validateRanges(v, add)
	o.validateLimits(add)
	o.validateKubeProxyFlags(add)
	o.validateListeners(add)
	o.validateNodeIP(v, add)
	o.validateSource(add)
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return v, nil
}

// validateDataPath checks how connections are relayed: the data path and
// kube-proxy's --proxy-mode, of which only "userspace" is this proxy.
func (o *options) validateDataPath(add func(string, ...any)) {
	if !slices.Contains(proxier.DataPaths, o.dataPath) {
		add("--data-path %q is not one of %s", o.dataPath, strings.Join(proxier.DataPaths, ", "))
	}
	if o.proxyMode != "" && o.proxyMode != "userspace" {
		add("--proxy-mode %q is not supported: this proxy implements only \"userspace\"", o.proxyMode)
	}
}

// validateProxySockets checks where the proxy sockets listen: the bind
// address portal rules must reach, and the proxy port range.
func (o *options) validateProxySockets(v *validated, add func(string, ...any)) {
	var err error
	if v.bind, err = netip.ParseAddr(o.bindAddress); err != nil {
		add("--bind-address %q is not an IP address", o.bindAddress)
	} else if v.bind.Zone() != "" {
		// Portal rules cannot name a zone: every restore would fail.
		add("--bind-address %q: IPv6 zone ids are not supported; give the address without %%%s", o.bindAddress, v.bind.Zone())
	}
	v.bind = v.bind.Unmap()
	if v.bind.IsLoopback() && o.iptables && !o.cleanup {
		// PREROUTING DNAT to a loopback address is dropped by the kernel
		// (route_localnet is off), so no portal could ever reach the socket.
		add("--bind-address %s is a loopback address, which portal rules cannot reach: use --iptables=false, or bind 0.0.0.0 or a node address", v.bind)
	}
	if v.bind.Is6() && v.bind.IsLinkLocalUnicast() && !o.cleanup {
		// A socket listens on a link-local address only with its
		// interface (bind: EINVAL at every sync, nothing served), whose
		// zone id is refused above; and other links' traffic could not be
		// DNATed to it.
		// Without the zone, which is refused above: the advice must not
		// give back a value refused in turn.
		ll := v.bind.WithZone("")
		add("--bind-address %s is an IPv6 link-local address, on which a proxy socket cannot listen without its interface: bind :: (with --node-ip %s if it must be the node IP) or a global address", ll, ll)
	}
	if v.portRange, err = proxier.ParsePortRange(o.proxyPortRange); err != nil {
		add("--proxy-port-range: %v", err)
	}
}

// validateUDP checks the UDP session timeout and bounds.
func (o *options) validateUDP(add func(string, ...any)) {
	if o.udpTimeout <= 0 {
		add("--udp-timeout must be greater than 0, got %v", o.udpTimeout)
	}
	if o.udpMaxPerPort <= 0 {
		add("--udp-max-sessions-per-port must be greater than 0, got %d", o.udpMaxPerPort)
	}
	if o.udpMaxSessions <= 0 {
		add("--udp-max-sessions must be greater than 0, got %d", o.udpMaxSessions)
	}
}

// validateSyncPeriods checks the rule sync's period and its minimum.
func (o *options) validateSyncPeriods(add func(string, ...any)) {
	if o.syncPeriod <= 0 {
		add("--iptables-sync-period must be greater than 0, got %v", o.syncPeriod)
	}
	if o.minSyncPeriod < 0 {
		add("--iptables-min-sync-period must not be negative, got %v", o.minSyncPeriod)
	}
	// The minimum in force: with --iptables=false and none given it is
	// 100ms, and a sync period between that and the 1 s default was
	// refused by the 1 s that does not apply.
	if m := o.effectiveMinSyncPeriod(); m > o.syncPeriod {
		add("--iptables-min-sync-period (%v) must not exceed --iptables-sync-period (%v)", m, o.syncPeriod)
	}
}

// validateAPIClient checks the API client's rate limits and the period of
// the informers' resync.
func (o *options) validateAPIClient(add func(string, ...any)) {
	// No check of --kube-api-qps: kube-proxy validates only the burst,
	// and client-go takes a negative QPS for no client-side rate limit.
	if o.kubeAPIBurst < 0 {
		add("--kube-api-burst must not be negative, got %d", o.kubeAPIBurst)
	}
	// client-go makes no client of a positive QPS without a burst (a 0
	// from --config is unset, the default 10): it was exit 1 as the client
	// started, after --init-only and validation said all was well.
	if o.kubeAPIBurst == 0 && o.kubeAPIQPS > 0 {
		add("--kube-api-burst must be greater than 0 when --kube-api-qps is (%v): client-go needs a burst to rate-limit", o.kubeAPIQPS)
	}
	if o.configSyncPeriod <= 0 {
		add("--config-sync-period must be greater than 0, got %v", o.configSyncPeriod)
	}
}

// validateStateFile checks the last-known-state file and its grace.
func (o *options) validateStateFile(add func(string, ...any)) {
	if o.stateFileGrace < 0 {
		add("--state-file-grace must not be negative, got %v", o.stateFileGrace)
	}
	if o.stateFile != "" && o.manifests != "" && !o.cleanup {
		add("--state-file keeps what an API server gave, and --manifests reads no API server: the manifests are their own last known state; drop one of the two")
	} else if o.stateFile != "" && !o.cleanup {
		if err := config.CheckStateFile(o.stateFile); err != nil {
			add("--state-file %q: %v", o.stateFile, err)
		}
	}
}

// validateTCPTimeouts checks the proxied TCP connections' timeouts and
// keep-alive against what the kernel takes.
func (o *options) validateTCPTimeouts(add func(string, ...any)) {
	if o.halfCloseTimeout < 0 {
		add("--tcp-half-close-timeout must not be negative, got %v", o.halfCloseTimeout)
	}
	for _, d := range []struct {
		flag  string
		value time.Duration
	}{{"--tcp-keepalive-idle", o.keepAliveIdle}, {"--tcp-user-timeout", o.tcpUserTimeout}, {"--tcp-write-timeout", o.tcpWriteTimeout}} {
		if d.value < 0 {
			add("%s must not be negative, got %v", d.flag, d.value)
		}
	}
	if o.maxConnectionAge < 0 {
		add("--max-connection-age must not be negative, got %v", o.maxConnectionAge)
	}
	if o.closeDeadline < 0 {
		add("--connection-close-deadline must not be negative, got %v", o.closeDeadline)
	}
	if o.closeQuiet <= 0 {
		add("--connection-close-quiet must be greater than 0, got %v", o.closeQuiet)
	}
	// The kernel counts keep-alive times in whole seconds; a fraction was
	// rounded without a word.
	if o.keepAliveIdle > 0 && o.keepAliveIdle%time.Second != 0 {
		add("--tcp-keepalive-idle must be whole seconds (TCP keep-alive counts in seconds), got %v", o.keepAliveIdle)
	}
	if o.keepAliveIdle > 0 && o.keepAliveInterval > 0 && o.keepAliveInterval%time.Second != 0 {
		add("--tcp-keepalive-interval must be whole seconds (TCP keep-alive counts in seconds), got %v", o.keepAliveInterval)
	}
	if o.keepAliveIdle > 0 && o.keepAliveInterval <= 0 {
		add("--tcp-keepalive-interval must be greater than 0 with keep-alive on, got %v", o.keepAliveInterval)
	}
	if o.keepAliveIdle > 0 && o.keepAliveCount <= 0 {
		add("--tcp-keepalive-count must be greater than 0 with keep-alive on, got %d", o.keepAliveCount)
	}
	// Past the kernel's limits the setsockopt fails (EINVAL), and with it
	// every TCP proxy socket at every sync, in a log line naming no flag.
	if o.keepAliveIdle > relay.MaxKeepAliveIdle {
		add("--tcp-keepalive-idle must be at most %v (the kernel's limit), got %v", relay.MaxKeepAliveIdle, o.keepAliveIdle)
	}
	if o.keepAliveIdle > 0 && o.keepAliveInterval > relay.MaxKeepAliveInterval {
		add("--tcp-keepalive-interval must be at most %v (the kernel's limit), got %v", relay.MaxKeepAliveInterval, o.keepAliveInterval)
	}
	if o.keepAliveIdle > 0 && o.keepAliveCount > relay.MaxKeepAliveCount {
		add("--tcp-keepalive-count must be at most %d (the kernel's limit), got %d", relay.MaxKeepAliveCount, o.keepAliveCount)
	}
	if o.tcpUserTimeout > relay.MaxUserTimeout {
		add("--tcp-user-timeout must be at most %v (the kernel's limit), got %v", relay.MaxUserTimeout, o.tcpUserTimeout)
	}
}

// validateNodePortAddresses parses --nodeport-addresses as kube-proxy
// does.
func (o *options) validateNodePortAddresses(v *validated, add func(string, ...any)) {
	// kube-proxy's list: CIDRs and the keywords primary, localhost and
	// all, in any combination, a keyword at most once.
	seenKeyword := map[string]bool{}
	for _, c := range o.nodePortAddresses {
		c = strings.TrimSpace(c)
		switch c {
		case nodePortAddressesPrimary, nodePortAddressesLocalhost, nodePortAddressesAll:
			if seenKeyword[c] {
				add("--nodeport-addresses: %q is given twice", c)
				continue
			}
			seenKeyword[c] = true
			if c == nodePortAddressesPrimary {
				v.nodePortPrimary = true // resolveNodePortAddresses adds the node IPs
				continue
			}
			v.nodePortAddresses = append(v.nodePortAddresses, nodePortKeywordCIDRs[c]...)
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			add("--nodeport-addresses: %q is not a CIDR, nor one of the keywords primary, localhost, all", c)
			continue
		}
		v.nodePortAddresses = append(v.nodePortAddresses, p.Masked())
	}
}

// validateRanges parses the cluster's address and port ranges.
func (o *options) validateRanges(v *validated, add func(string, ...any)) {
	var err error
	if v.clusterCIDRs, err = parseClusterCIDR(o.clusterCIDR); err != nil {
		add("--cluster-cidr: %v", err)
	}
	if v.serviceCIDRs, err = config.ParseServiceClusterIPRange(o.serviceCIDRs); err != nil {
		add("--service-cluster-ip-range: %v", err)
	}
	if v.nodePorts, err = parseNodePortRange(o.nodePortRange); err != nil {
		add("--service-node-port-range: %v", err)
	}
}

// validateLimits checks the bounds on faults, affinity entries, each
// service port's TCP connections and the HTTP servers' connections.
func (o *options) validateLimits(add func(string, ...any)) {
	if o.faultMaxActive < 0 {
		add("--fault-max-active must not be negative, got %d", o.faultMaxActive)
	}
	if o.faultMaxBuffered < 0 {
		add("--fault-max-buffered-bytes must not be negative, got %d", o.faultMaxBuffered)
	}
	if o.affinityMaxEntries < 0 {
		add("--affinity-max-entries-per-port must not be negative, got %d", o.affinityMaxEntries)
	}
	if o.tcpMaxPerPort < -1 {
		add("--tcp-max-connections-per-port must be -1 (no cap), 0 (the default) or greater, got %d", o.tcpMaxPerPort)
	}
	if o.httpMaxConns < 0 {
		add("--http-max-connections must not be negative, got %d", o.httpMaxConns)
	}
	if o.httpIdleTimeout <= 0 {
		add("--http-idle-timeout must be greater than 0, got %v", o.httpIdleTimeout)
	}
}

// validateListeners checks the addresses of the health, metrics and fault
// API servers, giving a port to one without, and that no two share one.
func (o *options) validateListeners(add func(string, ...any)) {
	// An address without a port gets the server's default port, as
	// kube-proxy's (AppendPortIfNeeded): --healthz-bind-address=0.0.0.0.
	o.healthzBindAddress = withDefaultPort(o.healthzBindAddress, defaultHealthzPort)
	o.metricsBindAddress = withDefaultPort(o.metricsBindAddress, defaultMetricsPort)
	var listening []listenFlag
	for _, a := range []struct{ flag, value string }{{"--healthz-bind-address", o.healthzBindAddress}, {"--metrics-bind-address", o.metricsBindAddress}, {"--fault-api-bind-address", o.faultAPIBind}} {
		if a.value == "" {
			continue
		}
		if err := checkHostPort(a.value); err != nil {
			add("%s %q: %v", a.flag, a.value, err)
			continue
		}
		// Two of our own servers on one address: the second could never
		// listen, and was retried every 5 s for good.
		b := listenFlag{flag: a.flag, value: a.value}
		for _, other := range listening {
			if other.clashes(b) {
				add("%s (%s) and %s (%s) cannot both listen there: give them different ports", other.flag, other.value, b.flag, b.value)
			}
		}
		listening = append(listening, b)
	}
}

// validateNodeName checks how the node is named.
func (o *options) validateNodeName(add func(string, ...any)) {
	if o.hostnameOverride != "" && strings.TrimSpace(o.hostnameOverride) == "" {
		add("--hostname-override %q is blank: give a node name, or leave it out to use the hostname", o.hostnameOverride)
	}
}

// validateNodeIP checks the node's address the flag gives.
func (o *options) validateNodeIP(v *validated, add func(string, ...any)) {
	var err error
	if o.nodeIP != "" {
		if v.nodeIP, err = netip.ParseAddr(o.nodeIP); err != nil {
			add("--node-ip %q is not an IP address", o.nodeIP)
		} else if v.nodeIP.Zone() != "" {
			add("--node-ip %q: IPv6 zone ids are not supported; give the address without %%%s", o.nodeIP, v.nodeIP.Zone())
		} else if v.nodeIP = v.nodeIP.Unmap(); v.nodeIP.IsUnspecified() {
			add("--node-ip %s is not an address of the node: give one, or leave it out for the default route's source address", v.nodeIP)
		} else if v.nodeIP.IsLoopback() && o.iptables && !o.cleanup {
			// As --bind-address: pods' and other hosts' traffic DNATed to
			// a loopback address is dropped (route_localnet is off).
			add("--node-ip %s is a loopback address, which portal rules cannot reach from pods or other hosts: give a node address", v.nodeIP)
		}
	}
}

// validateSource checks that exactly one source of Services is given (none
// is fine in a pod, which reads the API server it runs under) and that the
// path or URL it names is there.
func (o *options) validateSource(add func(string, ...any)) {
	if o.manifests != "" && !o.cleanup {
		// As kube-proxy's --config: a path that is not there at start is a
		// mistake in the flags (a typo, a volume not mounted), not something
		// to wait for. One removed later is the source's: it keeps serving
		// the last good state and reads the path again when it returns.
		if _, err := os.Stat(o.manifests); err != nil {
			add("--manifests %q: %v", o.manifests, statReason(err))
		}
	}
	if o.kubeconfig != "" && !o.cleanup {
		// Likewise a kubeconfig that is not there, or does not parse (as a
		// --config that does not): a usage error (exit 2) naming the flag or
		// the --config field, not a start-up failure.
		if _, err := os.Stat(o.kubeconfig); err != nil {
			add("%s %q: %v", cmp.Or(o.kubeconfigField, "--kubeconfig"), o.kubeconfig, statReason(err))
		} else if _, err := clientcmd.LoadFromFile(o.kubeconfig); err != nil {
			add("%s %q: not a kubeconfig: %v", cmp.Or(o.kubeconfigField, "--kubeconfig"), o.kubeconfig, err)
		}
	}
	if o.master != "" {
		if err := checkMasterURL(o.master); err != nil {
			add("--master %q: %v", o.master, err)
		}
	}
	if !o.cleanup {
		sources := 0
		if o.manifests != "" {
			sources++
		}
		if o.kubeconfig != "" || o.master != "" {
			sources++
		}
		switch {
		case sources > 1 && o.kubeconfigField != "" && o.master == "":
			add("--manifests cannot be combined with %s: choose one source (remove the field, or drop --manifests)", o.kubeconfigField)
		case sources > 1:
			add("--manifests cannot be combined with --kubeconfig/--master: choose one source")
		case sources == 0 && os.Getenv("KUBERNETES_SERVICE_HOST") == "" && o.writeConfigTo == "":
			msg := "no source: give --manifests PATH, or --kubeconfig/--master for an API server (or run in a pod); " +
				"try `kube-userspace-proxy demo` for a self-contained demonstration"
			// As kube-proxy, only --kubeconfig names one: a kubectl
			// user's KUBECONFIG looked taken.
			if env := os.Getenv("KUBECONFIG"); env != "" {
				msg += fmt.Sprintf(" (KUBECONFIG is not read, as by kube-proxy: give --kubeconfig %s)", env)
			}
			add("%s", msg)
		}
	}
}
