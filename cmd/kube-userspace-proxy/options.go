package main

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/httpserver"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// options are the command-line flags; names and defaults are kube-proxy's
// wherever kube-proxy has the flag (the contract in DESIGN.md).
type options struct {
	manifests      string
	kubeconfig     string
	master         string
	bindAddress    string
	proxyPortRange string
	udpTimeout     time.Duration
	udpMaxPerPort  int
	udpMaxSessions int
	syncPeriod     time.Duration
	minSyncPeriod  time.Duration
	// minSyncPeriodGiven: --iptables-min-sync-period or its --config field
	// was given (see effectiveMinSyncPeriod).
	minSyncPeriodGiven bool
	// udpMaxPerPortGiven: --udp-max-sessions-per-port was given, so the
	// descriptor limit does not scale it (proxier's udpCaps).
	udpMaxPerPortGiven bool
	hostnameOverride   string
	nodePortAddresses  []string
	clusterCIDR        string
	healthzBindAddress string
	metricsBindAddress string
	iptables           bool
	cleanup            bool
	proxyMode          string
	configSyncPeriod   time.Duration
	// The API-server client's rate and encoding (kube-proxy's flags).
	kubeAPIQPS         float32
	kubeAPIBurst       int
	kubeAPIContentType string
	nodeIP             string
	preroutingRedirect bool
	halfCloseTimeout   time.Duration
	// tcpMaxPerPort: --tcp-max-connections-per-port (0: the default
	// share, negative: none).
	tcpMaxPerPort      int
	maxConnectionAge   time.Duration
	closeQuiet         time.Duration
	closeDeadline      time.Duration
	multipathTCP       bool
	dataPath           string
	keepAliveIdle      time.Duration
	keepAliveInterval  time.Duration
	keepAliveCount     int
	tcpUserTimeout     time.Duration
	tcpWriteTimeout    time.Duration
	configFile         string
	faultAPIBind       string
	faultSeed          int64
	faultMaxActive     int
	faultMaxBuffered   int64
	serviceCIDRs       string
	nodePortRange      string
	affinityMaxEntries int
	httpMaxConns       int
	httpIdleTimeout    time.Duration
	stateFile          string
	stateFileGrace     time.Duration
	// kube-proxy's flags: deprecated ports, --init-only, and those accepted
	// and not acted on (kubeproxyflags.go).
	healthzPort, metricsPort int32
	initOnly                 bool
	writeConfigTo            string
	bindAddressHardFail      bool
	kubeProxy                kubeProxyFlags

	// kubeconfigField names the --config field kubeconfig came from, when
	// it did not come from the flag, so that errors blame what the user wrote.
	kubeconfigField string
	// fileFields maps each flag --config set to the field that set it, so
	// that a bad value is blamed on what the user wrote.
	fileFields map[string]string
	// configLoaded is --config's content at start, and configCheck (nil:
	// the file is not watched) tells whether other content would start;
	// see configwatch.go.
	configLoaded []byte
	configCheck  func([]byte) error
	// configFeatureGates is --config's featureGates, the gates kube-proxy
	// checks its logging flags with beside --config (validateKubeProxyFlags).
	configFeatureGates map[string]bool
	// configLoggingFormat is the logging format beside --config: the
	// file's logging.format, or --logging-format's when given, which
	// kube-proxy checks --vmodule with (validateKubeProxyFlags).
	configLoggingFormat string
	// vmoduleFlag is --vmodule as given on the command line ("": not
	// given), which kube-proxy checks as its logging.vmodule.
	vmoduleFlag string
	// configFieldErrors are kube-proxy's refusals of --config's fields
	// this proxy does not act on, which validate reports with the other
	// errors: returned at once, they hid them until fixed.
	configFieldErrors []string
	// logVerbosity is klog's -v in force (the flag when given, else
	// --config's logging.verbosity), which /configz reports.
	logVerbosity uint32
	// logVModule is klog's -vmodule in force (pattern=N,...), likewise.
	logVModule string
	// kubeAPIAcceptContentTypes is --config's clientConnection.
	// acceptContentTypes (kube-proxy has no flag for it); "" follows the
	// content type (see acceptContentTypes).
	kubeAPIAcceptContentTypes string
}

func newOptions() *options {
	return &options{
		bindAddress:        "0.0.0.0",
		udpTimeout:         250 * time.Millisecond,
		udpMaxPerPort:      proxier.DefaultUDPMaxSessionsPerPort,
		udpMaxSessions:     proxier.DefaultUDPMaxSessions,
		syncPeriod:         30 * time.Second,
		minSyncPeriod:      time.Second,
		healthzBindAddress: "0.0.0.0:" + defaultHealthzPort,
		metricsBindAddress: "127.0.0.1:" + defaultMetricsPort,
		iptables:           true,
		proxyMode:          "userspace",
		dataPath:           proxier.DataPathEventLoop,
		configSyncPeriod:   15 * time.Minute,
		kubeAPIQPS:         5,
		kubeAPIBurst:       10,
		kubeAPIContentType: "application/vnd.kubernetes.protobuf",
		halfCloseTimeout:   2 * time.Minute,
		closeQuiet:         relay.DefaultQuiet,
		closeDeadline:      proxier.DefaultConnectionCloseDeadline,
		keepAliveIdle:      proxier.DefaultLiveness.KeepAliveIdle,
		keepAliveInterval:  proxier.DefaultLiveness.KeepAliveInterval,
		keepAliveCount:     proxier.DefaultLiveness.KeepAliveCount,
		tcpUserTimeout:     proxier.DefaultLiveness.UserTimeout,
		tcpWriteTimeout:    proxier.DefaultTCPWriteTimeout,
		serviceCIDRs:       config.DefaultServiceClusterIPRange,
		nodePortRange:      config.DefaultNodePortRange.String(),
		affinityMaxEntries: loadbalancer.DefaultMaxAffinityEntries,
		faultMaxBuffered:   faults.DefaultMaxBufferedBytes,
		httpMaxConns:       httpserver.DefaultLimits.MaxConns,
		httpIdleTimeout:    httpserver.DefaultLimits.IdleTimeout,
		stateFileGrace:     config.DefaultStateFileGrace,
		healthzPort:        defaultHealthzPortNumber,
		metricsPort:        defaultMetricsPortNumber,
	}
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	// As kube-proxy (component-base's cli.Run sets WordSepNormalizeFunc):
	// "_" in a flag's name reads as "-", so --hostname_override works.
	fs.SetNormalizeFunc(wordSepNormalize)
	fs.StringVar(&o.manifests, "manifests", o.manifests, "File or directory of YAML/JSON manifests (v1 Service, discovery.k8s.io/v1 EndpointSlice, v1 Endpoints); re-read on change.")
	fs.StringVar(&o.serviceCIDRs, "service-cluster-ip-range", o.serviceCIDRs, "With --manifests: CIDR (or an IPv4 and an IPv6 CIDR, comma-separated) a Service without clusterIP gets one from, by a hash of its namespace/name: the same on every start with the same files (kube-apiserver's flag). Empty: such a Service is an error.")
	fs.StringVar(&o.nodePortRange, "service-node-port-range", o.nodePortRange, "The range of node ports (BEGIN-END, BEGIN+N or one port; kube-apiserver's flag): with --manifests a Service's nodePort must be in it; without --proxy-port-range no proxy socket takes a port of it. Empty: the default.")
	fs.StringVar(&o.kubeconfig, "kubeconfig", o.kubeconfig, "Path to a kubeconfig file; watch Services and EndpointSlices on that API server.")
	fs.StringVar(&o.master, "master", o.master, "The address of the Kubernetes API server (overrides any value in kubeconfig).")
	fs.StringVar(&o.bindAddress, "bind-address", o.bindAddress, "The IP address proxy sockets listen on. 0.0.0.0 and :: both take every address of both families: a service port with IPv6 addresses listens on one dual-stack socket, one with IPv4 addresses only on an IPv4 socket (with ::, dual-stack too). A specific address takes its own family only.")
	fs.StringVar(&o.proxyPortRange, "proxy-port-range", o.proxyPortRange, "Range of host ports (BEGIN-END, BEGIN+N or one port) for proxy sockets; empty, '0' or '0-0' means free ports outside the kernel's ephemeral range (ip_local_port_range), kernel-chosen if none is free.")
	fs.DurationVar(&o.udpTimeout, "udp-timeout", o.udpTimeout, "How long an idle UDP session is kept open (e.g. '250ms', '2s'). Must be greater than 0.")
	fs.IntVar(&o.udpMaxPerPort, "udp-max-sessions-per-port", o.udpMaxPerPort, "At most this many UDP client sessions (one backend socket each) per service port; at the cap the oldest idle session is closed for the new one. The default is lowered with --udp-max-sessions when half the open-file limit or half the ephemeral ports hold that lower (3529 with the default ephemeral range; logged at start). Must be greater than 0.")
	fs.IntVar(&o.udpMaxSessions, "udp-max-sessions", o.udpMaxSessions, "At most this many UDP client sessions in total, and never more than half of the open-file limit (the rest stays for TCP) nor half of the ephemeral ports (each session holds a local port; the rest stays for the node's own UDP clients); at the cap the service port holding the most sessions gives up its oldest idle one (a port its own only when no other holds more, or when none of those has one idle); the datagram is dropped only when none has one. Must be greater than 0.")
	fs.IntVar(&o.tcpMaxPerPort, "tcp-max-connections-per-port", o.tcpMaxPerPort, "At most this many TCP connections (two descriptors each) per service port; a new client past it is reset at once, and the port's connections go on. 0 means the default: a quarter of the connections' descriptor ceiling (RLIMIT_NOFILE less max(64, limit/16)), half its descriptors, so one Service's clients leave the rest to the others (245760 under a limit of 1048576; logged at start). -1 means no cap.")
	fs.DurationVar(&o.syncPeriod, "iptables-sync-period", o.syncPeriod, "The maximum interval of how often rules are refreshed and repaired (e.g. '5s', '1m'). Must be greater than 0.")
	fs.DurationVar(&o.minSyncPeriod, "iptables-min-sync-period", o.minSyncPeriod, "The minimum interval between rule syncs as Services change (e.g. '1s'). 0 syncs on every change. With --iptables=false, where no rule is written, the default is 100ms.")
	fs.StringVar(&o.hostnameOverride, "hostname-override", o.hostnameOverride, "If non-empty, use this string as the node name instead of the hostname.")
	fs.StringSliceVar(&o.nodePortAddresses, "nodeport-addresses", o.nodePortAddresses, "CIDRs of the node addresses that accept NodePort traffic and serve healthCheckNodePorts (e.g. 10.0.0.0/8,192.168.0.0/16); and kube-proxy's keywords, in any combination: 'primary' the node IP of each family (--node-ip, else the Node object's, else the default route's source address), 'localhost' 127.0.0.0/8 and ::1/128, 'all' every address; a family without a CIDR is not restricted; empty means all local addresses.")
	fs.StringVar(&o.clusterCIDR, "cluster-cidr", o.clusterCIDR, "The CIDR range of the pods in the cluster (for dual-stack, an IPv4 and an IPv6 CIDR, comma-separated), kube-proxy's flag with detect-local-mode ClusterCIDR: traffic from it counts as the cluster's own, so pods reach the LoadBalancer IPs, external IPs and NodePorts of externalTrafficPolicy: Local Services through all endpoints, as the node itself does. Empty: only the node's own traffic is recognised.")
	fs.StringVar(&o.healthzBindAddress, "healthz-bind-address", o.healthzBindAddress, "HOST:PORT for the health check server (/healthz, /livez); an IP alone gets port 10256; empty disables it.")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", o.metricsBindAddress, "HOST:PORT for the metrics server (/metrics, /debug/services, /debug/connections, /proxyMode, /configz); an IP alone gets port 10249; empty disables it.")
	fs.BoolVar(&o.iptables, "iptables", o.iptables, "Program iptables portal rules. With --iptables=false only proxy sockets are served (no root needed).")
	fs.BoolVar(&o.cleanup, "cleanup", o.cleanup, "Remove every chain and rule this proxy installs (IPv4 and IPv6), then exit.")
	fs.StringVar(&o.proxyMode, "proxy-mode", o.proxyMode, "Which proxy mode to use: only 'userspace' is implemented.")
	fs.DurationVar(&o.configSyncPeriod, "config-sync-period", o.configSyncPeriod, "How often configuration from the API server is refreshed. Must be greater than 0.")
	fs.StringVar(&o.stateFile, "state-file", o.stateFile, "With an API server: a file to keep the last Services and EndpointSlices it gave in (rewritten after changes, at most every 10s, and at exit), served from when a start has not synced from the API server (listed every Service and EndpointSlice) within --state-file-grace, until it does, however long that takes (kubeproxy_userspace_last_known_state_serving is 1 meanwhile); kept on tmpfs (e.g. /run/kube-userspace-proxy/state.json) it lives as long as kube-proxy's kernel rules would: across a restart, not a reboot. Empty: none, and a start during an API server outage serves nothing until the API server answers.")
	fs.DurationVar(&o.stateFileGrace, "state-file-grace", o.stateFileGrace, "How long a start waits for the API server's lists before it serves --state-file's objects. Must not be negative.")
	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", o.kubeAPIQPS, "QPS to use while talking with the Kubernetes API server; a negative value means no client-side rate limit, 0 client-go's default (5).")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", o.kubeAPIBurst, "Burst to use while talking with the Kubernetes API server.")
	fs.StringVar(&o.kubeAPIContentType, "kube-api-content-type", o.kubeAPIContentType, "Content type of requests sent to the API server.")
	fs.StringVar(&o.nodeIP, "node-ip", o.nodeIP, "The node's IP, target of the portals' DNAT (from the node itself, and with --bind-address 0.0.0.0 from pods and other hosts too); default: with an API server the Node object's (its first InternalIP, else ExternalIP, that an interface here holds, read once at start), else the default route's source address (the route's src, else the kernel's choice on its interface, as 'ip route get' shows). The other IP family uses the Node object's address of that family, else its own default route's source address.")
	fs.BoolVar(&o.preroutingRedirect, "prerouting-redirect", o.preroutingRedirect, "With --bind-address 0.0.0.0 (or ::): send traffic from pods and other hosts to proxy sockets with REDIRECT, as the legacy userspace mode did, instead of DNAT to the node IP. REDIRECT drops packets that arrive on an interface without an address (pod veths on Calico, the AWS VPC CNI).")
	fs.StringVar(&o.configFile, "config", o.configFile, "A KubeProxyConfiguration file; flags given on the command line override it.")
	fs.StringVar(&o.faultAPIBind, "fault-api-bind-address", o.faultAPIBind, "HOST:PORT for Toxiproxy's REST API over this node's service ports (e.g. 127.0.0.1:8474); empty disables it.")
	fs.Var(int64Value{&o.faultSeed}, "fault-seed", "Seed of every fault draw: the same seed and arrival order give the same faults.")
	fs.IntVar(&o.faultMaxActive, "fault-max-active", o.faultMaxActive, "At most this many live faulted connections per service port; further connections get no fault, except down and refuse, which hold no slot. 0 means unlimited.")
	fs.Var(int64Value{&o.faultMaxBuffered}, "fault-max-buffered-bytes", "At most this many bytes held in flight (read, not yet written) by the faulted TCP connections of every service port together; past it a faulted direction stops reading, and its sender is held back by TCP flow control, except that a direction holding nothing still reads one buffer (32 KiB); UDP datagrams a latency toxic delays count too, and one past it is dropped. 0 means unlimited.")
	fs.IntVar(&o.affinityMaxEntries, "affinity-max-entries-per-port", o.affinityMaxEntries, "At most this many clients in one service port's ClientIP affinity table; a new client of a full table evicts the least recently used one. 0 means unlimited.")
	fs.IntVar(&o.httpMaxConns, "http-max-connections", o.httpMaxConns, "At most this many open connections per HTTP server (health, metrics, healthCheckNodePort, fault API); at the cap a new client takes the place of the longest-idle keep-alive connection, or waits in the listen backlog while every connection is busy with a request. 0 means unlimited.")
	fs.DurationVar(&o.httpIdleTimeout, "http-idle-timeout", o.httpIdleTimeout, "How long an HTTP server keeps an idle keep-alive connection open (e.g. '30s'). Must be greater than 0.")
	fs.BoolVar(&o.multipathTCP, "mptcp", o.multipathTCP, "Accept clients on the TCP proxy sockets with Multipath TCP (Go's default listener); off, they listen with plain TCP, so an MPTCP client falls back to TCP, which costs less per connection. Backends are always dialled with plain TCP.")
	fs.StringVar(&o.dataPath, "data-path", o.dataPath, "How proxied TCP connections are relayed: 'eventloop' (one epoll loop per CPU accepts, dials and relays every connection: no goroutine per connection, less CPU per new connection, almost no memory per idle one) or 'goroutines' (two goroutines per connection). Either way a connection that draws a fault is relayed by goroutines (its toxics run there).")
	fs.DurationVar(&o.halfCloseTimeout, "tcp-half-close-timeout", o.halfCloseTimeout, "After one side of a proxied TCP connection closes, how long the other direction may go without receiving a byte or delivering one before both sides are reset; 0 means no limit.")
	fs.DurationVar(&o.keepAliveIdle, "tcp-keepalive-idle", o.keepAliveIdle, "TCP keep-alive on both sockets of a proxied connection (client and backend): how long it may be idle before the first probe (whole seconds), so a peer that vanished without a FIN is found and both sides reset. 0 turns keep-alive off.")
	fs.DurationVar(&o.keepAliveInterval, "tcp-keepalive-interval", o.keepAliveInterval, "Time between TCP keep-alive probes that go unanswered (whole seconds).")
	fs.IntVar(&o.keepAliveCount, "tcp-keepalive-count", o.keepAliveCount, "Unanswered TCP keep-alive probes before the connection is ended (when --tcp-user-timeout is set the kernel ends it after that time instead: keep it at least idle + interval x count).")
	fs.DurationVar(&o.tcpUserTimeout, "tcp-user-timeout", o.tcpUserTimeout, "TCP_USER_TIMEOUT on both sockets of a proxied connection: data or a keep-alive probe unacknowledged this long, or a peer window closed this long, ends the connection (both sides reset). 0 keeps the kernel's retransmission limit (about 15 minutes).")
	fs.DurationVar(&o.maxConnectionAge, "max-connection-age", o.maxConnectionAge, "Close a proxied TCP connection older than this at its next quiet moment (see --connection-close-quiet; the client gets a FIN and its pool reconnects, to any endpoint), so kept-alive pools spread over endpoints added later. A Service's kube-userspace-proxy/max-connection-age annotation overrides it ('0' turns it off for that Service). 0 means off.")
	fs.DurationVar(&o.closeQuiet, "connection-close-quiet", o.closeQuiet, "How long both directions of a TCP connection must be silent, with nothing in flight, before --max-connection-age or a Service's kube-userspace-proxy/drain-removed closes it, so that no request is cut mid-flight. Must be greater than 0.")
	fs.DurationVar(&o.closeDeadline, "connection-close-deadline", o.closeDeadline, "How long past its max age (or drain time) a TCP connection that is never quiet for --connection-close-quiet (a kept-alive pool's connection with a request always going) is waited for before it is closed anyway: what was read is delivered, then both sides get a FIN; a request in progress is cut. 0 means wait for a quiet moment however long.")
	fs.DurationVar(&o.tcpWriteTimeout, "tcp-write-timeout", o.tcpWriteTimeout, "How long a direction of a proxied TCP connection may be unable to write a single byte (its peer reads nothing) before both sides are reset; 0 means no limit.")
	fs.BoolVar(&o.bindAddressHardFail, "bind-address-hard-fail", o.bindAddressHardFail, "Exit 1 when the health, metrics or fault API server cannot bind its address (kube-proxy's flag); without it such a server is logged and retried every 5s while the proxy serves.")
	fs.BoolVar(&o.initOnly, "init-only", o.initOnly, "kube-proxy's flag for an init container: this proxy needs no privileged initialisation, so it checks the flags and exits 0.")
	fs.StringVar(&o.writeConfigTo, "write-config-to", "", "If set, write the configuration in force (the defaults, --config and the flags) to this file as a KubeProxyConfiguration that --config reads back, and exit (kube-proxy's flag). Only KubeProxyConfiguration's fields are written: this proxy's own flags (--manifests, --iptables, --fault-*, ...) are not. It needs no source.")
	o.addKubeProxyFlags(fs)
}

// validated holds options parsed into the types the proxier uses.
type validated struct {
	bind              netip.Addr
	portRange         proxier.PortRange
	nodePortAddresses []netip.Prefix
	// nodePortPrimary: --nodeport-addresses primary, the node IP of each
	// family (resolveNodePortAddresses turns it into nodePortAddresses).
	nodePortPrimary bool
	clusterCIDRs    []netip.Prefix
	nodeIP          netip.Addr
	// nodeObjectIPs: the Node object's node IPs (readNodeObjectIPs), for
	// the families no flag names an address of.
	nodeObjectIPs  []netip.Addr
	nodeObjectRead bool // the Node object was read at start (readNodeObjectIPs)
	// portalNodeIPs are, by family (0: IPv4, 1: IPv6), the node IPs the
	// portals were built with (portalSyncers; invalid: none, REDIRECT),
	// when portalNodeIPsSet: the node IP watches compare with these, not
	// with the default route read again later (hostIPsInUse).
	portalNodeIPs    [2]netip.Addr
	portalNodeIPsSet bool
	// nodeObjectZone is that Node's topology.kubernetes.io/zone label, ""
	// when it has none or was not read: explain's plan applies the zone
	// hints of this zone, as the proxy does with its Node informer's.
	nodeObjectZone string
	serviceCIDRs   []netip.Prefix
	// nodePorts is --service-node-port-range.
	nodePorts config.PortRange
	// preroutingRedirect: the legacy REDIRECT in PREROUTING (see the flag).
	preroutingRedirect bool
}

// effectiveMinSyncPeriod is the minimum between syncs. It rate-limits
// iptables-restore runs, so with --iptables=false, where a sync writes no
// rule, its default is noRulesMinSyncPeriod: a change is served about as
// soon as it arrives (the third of three Services created within a second
// waited up to 1 s for its token, 1.09 s with the manifests' settle time,
// past the 1 s the manifests source promises), and a storm of Service
// changes at 10,000 Services (a sync there costs about 50 ms) still
// leaves most of a CPU. A value given still applies.
func (o *options) effectiveMinSyncPeriod() time.Duration {
	if !o.iptables && !o.minSyncPeriodGiven {
		return noRulesMinSyncPeriod
	}
	return o.minSyncPeriod
}

// noteGivenFlags records which flags were given, by the command line or
// --config, where a default depends on it: every parse of the flags
// (runMain, explain, the --config check) calls it before validate.
func (o *options) noteGivenFlags(fs *pflag.FlagSet) {
	o.minSyncPeriodGiven = fs.Changed("iptables-min-sync-period") || o.fileFields["iptables-min-sync-period"] != ""
	o.udpMaxPerPortGiven = fs.Changed("udp-max-sessions-per-port")
	// Not one --config's logging.vmodule set (applyConfig): that is the
	// file's to check.
	if f := fs.Lookup("vmodule"); f != nil && fs.Changed("vmodule") && o.fileFields["vmodule"] == "" {
		o.vmoduleFlag = f.Value.String()
	}
}

// noRulesMinSyncPeriod is --iptables-min-sync-period's default with
// --iptables=false.
const noRulesMinSyncPeriod = 100 * time.Millisecond

// liveness is the keep-alive and user timeout the flags ask for.
func (o *options) liveness() relay.Liveness {
	return relay.Liveness{KeepAliveIdle: o.keepAliveIdle, KeepAliveInterval: o.keepAliveInterval,
		KeepAliveCount: o.keepAliveCount, UserTimeout: o.tcpUserTimeout}
}

// blameConfigFile adds to a message about flags the --config fields that
// set them: "--iptables-sync-period must be greater than 0, got -5s
// (iptables.syncPeriod in --config proxy.yaml)".
func (o *options) blameConfigFile(msg string) string {
	var fields []string
	for _, flag := range slices.Sorted(maps.Keys(o.fileFields)) {
		if mentionsFlag(msg, flag) {
			fields = append(fields, o.fileFields[flag])
		}
	}
	if len(fields) == 0 {
		return msg
	}
	return fmt.Sprintf("%s (%s in --config %s)", msg, strings.Join(fields, ", "), o.configFile)
}

// mentionsFlag reports whether msg names --flag itself (not a longer flag
// that starts with the same words).
func mentionsFlag(msg, flag string) bool {
	for rest := msg; ; {
		i := strings.Index(rest, "--"+flag)
		if i < 0 {
			return false
		}
		rest = rest[i+2+len(flag):]
		if rest == "" || !(rest[0] == '-' || rest[0] >= 'a' && rest[0] <= 'z') {
			return true
		}
	}
}

// parseNodePortRange reads --service-node-port-range as kube-apiserver
// does: BEGIN-END, BEGIN+N (BEGIN to BEGIN+N) or one port; empty is the
// default range.
func parseNodePortRange(s string) (config.PortRange, error) {
	if strings.TrimSpace(s) == "" {
		return config.DefaultNodePortRange, nil
	}
	r, err := proxier.ParsePortRange(s)
	if err != nil {
		return config.PortRange{}, err
	}
	if r.Size == 0 { // "0" or "0-0", kernel-chosen ports to --proxy-port-range
		return config.PortRange{}, fmt.Errorf("%q names no port (node ports are 1-65535)", s)
	}
	return config.PortRange{Min: int32(r.Base), Max: int32(r.Base + r.Size - 1)}, nil
}

// parseClusterCIDR reads kube-proxy's --cluster-cidr: empty, one CIDR, or
// an IPv4 and an IPv6 CIDR separated by a comma.
func parseClusterCIDR(s string) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []netip.Prefix
	families := map[bool]bool{}
	for _, c := range strings.Split(s, ",") {
		c = strings.TrimSpace(c)
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR", c)
		}
		p = p.Masked()
		if families[p.Addr().Is4()] {
			return nil, fmt.Errorf("%q: at most one CIDR per IP family", s)
		}
		families[p.Addr().Is4()] = true
		out = append(out, p)
	}
	return out, nil
}

// int64Value is pflag's int64 flag, save that an integer out of int64's
// range is said to be: pflag's says "must be an integer" of it.
type int64Value struct{ p *int64 }

func (v int64Value) String() string { return strconv.FormatInt(*v.p, 10) }
func (v int64Value) Type() string   { return "int64" }

func (v int64Value) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, 64) // as pflag parses it
	switch {
	case errors.Is(err, strconv.ErrRange):
		return fmt.Errorf("out of range: from %d to %d", int64(math.MinInt64), int64(math.MaxInt64))
	case err != nil:
		return errors.New("must be an integer")
	}
	*v.p = n
	return nil
}

// listenFlag is the HOST:PORT flag of one of the proxy's HTTP servers.
type listenFlag struct{ flag, value string }

// clashes reports whether a and b cannot both listen: one port (not 0,
// which picks a free one) on one host, or on a wildcard host (0.0.0.0 and
// :: take the port on every address of both families, as Go listens on
// them) beside any other. Host names are compared as written.
func (a listenFlag) clashes(b listenFlag) bool {
	ah, ap, err1 := net.SplitHostPort(a.value)
	bh, bp, err2 := net.SplitHostPort(b.value)
	if err1 != nil || err2 != nil || ap != bp {
		return false
	}
	if n, err := strconv.Atoi(ap); err != nil || n == 0 {
		return false
	}
	wildcard := func(h string) bool {
		ip, err := netip.ParseAddr(h)
		return h == "" || err == nil && ip.IsUnspecified()
	}
	if wildcard(ah) || wildcard(bh) {
		return true
	}
	aip, errA := netip.ParseAddr(ah)
	bip, errB := netip.ParseAddr(bh)
	if errA == nil && errB == nil {
		return aip.Unmap() == bip.Unmap()
	}
	return ah == bh
}

// wordSepNormalize is component-base's cliflag.WordSepNormalizeFunc.
func wordSepNormalize(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
}
