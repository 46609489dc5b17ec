package main

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
)

// kubeProxyFlags holds kube-proxy's flags that this proxy accepts without
// acting on them: a kube-proxy DaemonSet's command line passes them, and
// --config already tolerates their fields. They were "unknown flag" (exit
// 2), so a DaemonSet switched to this proxy crash-looped on a tuning flag
// that a userspace proxy has no use for.
type kubeProxyFlags struct {
	masqueradeAll, profiling, conntrackTCPBeLiberal, localhostNodePorts, ipvsStrictARP bool
	conntrackMaxPerCore, conntrackMin, oomScoreAdj, masqueradeBit                      int32
	conntrackTCPEstablished, conntrackTCPCloseWait, conntrackUDP, conntrackUDPStream   time.Duration
	ipvsSyncPeriod, ipvsMinSyncPeriod, ipvsTCP, ipvsTCPFin, ipvsUDP                    time.Duration
	featureGates                                                                       map[string]bool
	detectLocalMode, podBridgeInterface, podInterfaceNamePrefix                        string
	showHiddenMetricsForVersion, ipvsScheduler                                         string
	ipvsExcludeCIDRs                                                                   []string
	// component-base's logging flags (kube-proxy registers them): klog's
	// text output is what this proxy writes.
	// The buffer sizes are quantities (512, 1K, 2Ki), as component-base's.
	loggingFormat                          string
	logTextInfoBuffer, logJSONInfoBuffer   resource.QuantityValue
	logFlushFrequency                      time.Duration
	logTextSplitStream, logJSONSplitStream bool
}

// ignoredFlagAnnotation marks the flags of kubeProxyFlags, which --help
// lists in a section of their own and the start-up log names when given.
const ignoredFlagAnnotation = "kube-userspace-proxy/ignored"

// addKubeProxyFlags adds kube-proxy's flags this proxy does not act on,
// with kube-proxy's names and value types (so a value kube-proxy would
// refuse to parse is still an error), and the deprecated --healthz-port
// and --metrics-port, which it honours (see validate).
func (o *options) addKubeProxyFlags(fs *pflag.FlagSet) {
	k := &o.kubeProxy
	before := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) { before[f.Name] = true })
	const none = "Not acted on (kube-proxy's flag: accepted, and logged at start when given)."
	fs.BoolVar(&k.masqueradeAll, "masquerade-all", false, none)
	fs.Int32Var(&k.conntrackMaxPerCore, "conntrack-max-per-core", 32768, none)
	fs.Int32Var(&k.conntrackMin, "conntrack-min", 131072, none)
	fs.DurationVar(&k.conntrackTCPEstablished, "conntrack-tcp-timeout-established", 24*time.Hour, none)
	fs.DurationVar(&k.conntrackTCPCloseWait, "conntrack-tcp-timeout-close-wait", time.Hour, none)
	fs.BoolVar(&k.conntrackTCPBeLiberal, "conntrack-tcp-be-liberal", false, none)
	fs.DurationVar(&k.conntrackUDP, "conntrack-udp-timeout", 0, none)
	fs.DurationVar(&k.conntrackUDPStream, "conntrack-udp-timeout-stream", 0, none)
	fs.Int32Var(&k.oomScoreAdj, "oom-score-adj", -999, none)
	fs.Var(cliflag.NewMapStringBool(&k.featureGates), "feature-gates", none+" key=value pairs.")
	fs.BoolVar(&k.profiling, "profiling", false, none)
	fs.StringVar(&k.showHiddenMetricsForVersion, "show-hidden-metrics-for-version", "", none)
	fs.StringVar(&k.detectLocalMode, "detect-local-mode", "", "ClusterCIDR is what this proxy does with --cluster-cidr; NodeCIDR, BridgeInterface and InterfaceNamePrefix are accepted and not acted on (logged at start).")
	fs.StringVar(&k.podBridgeInterface, "pod-bridge-interface", "", none)
	fs.StringVar(&k.podInterfaceNamePrefix, "pod-interface-name-prefix", "", none)
	fs.Int32Var(&k.masqueradeBit, "iptables-masquerade-bit", 14, none)
	fs.BoolVar(&k.localhostNodePorts, "iptables-localhost-nodeports", true, none)
	fs.DurationVar(&k.ipvsSyncPeriod, "ipvs-sync-period", 30*time.Second, none)
	fs.DurationVar(&k.ipvsMinSyncPeriod, "ipvs-min-sync-period", 0, none)
	fs.StringVar(&k.ipvsScheduler, "ipvs-scheduler", "", none)
	fs.StringSliceVar(&k.ipvsExcludeCIDRs, "ipvs-exclude-cidrs", nil, none)
	fs.BoolVar(&k.ipvsStrictARP, "ipvs-strict-arp", false, none)
	fs.DurationVar(&k.ipvsTCP, "ipvs-tcp-timeout", 0, none)
	fs.DurationVar(&k.ipvsTCPFin, "ipvs-tcpfin-timeout", 0, none)
	fs.DurationVar(&k.ipvsUDP, "ipvs-udp-timeout", 0, none)
	fs.StringVar(&k.loggingFormat, "logging-format", "text", "text is what this proxy writes; json is accepted and not acted on (logged at start).")
	fs.DurationVar(&k.logFlushFrequency, "log-flush-frequency", 5*time.Second, none)
	fs.Var(&k.logTextInfoBuffer, "log-text-info-buffer-size", none)
	fs.BoolVar(&k.logTextSplitStream, "log-text-split-stream", false, none)
	fs.Var(&k.logJSONInfoBuffer, "log-json-info-buffer-size", none)
	fs.BoolVar(&k.logJSONSplitStream, "log-json-split-stream", false, none)
	fs.VisitAll(func(f *pflag.Flag) {
		if !before[f.Name] {
			_ = fs.SetAnnotation(f.Name, ignoredFlagAnnotation, []string{"true"})
		}
	})
	// kube-proxy's deprecated ports, honoured as kube-proxy does: 0
	// disables the server, another port is the port of a bind address
	// given without one. Hidden from --help, as pflag hides deprecated
	// flags in kube-proxy's.
	fs.Int32Var(&o.healthzPort, "healthz-port", o.healthzPort, "The port of the health server. 0 disables it.")
	_ = fs.MarkDeprecated("healthz-port", "use --healthz-bind-address instead.")
	fs.Int32Var(&o.metricsPort, "metrics-port", o.metricsPort, "The port of the metrics server. 0 disables it.")
	_ = fs.MarkDeprecated("metrics-port", "use --metrics-bind-address instead.")
}

// kube-proxy's --detect-local-mode values; ClusterCIDR (or none) is this
// proxy's own behaviour.
var detectLocalModes = []string{"", "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix"}

// validateKubeProxyFlags checks what kube-proxy's validation would refuse
// of the flags above beyond their types, and applies the ports.
func (o *options) validateKubeProxyFlags(add func(string, ...any)) {
	// Beside --config, kube-proxy discards these flags but the logging
	// ones (Complete replaces their configuration with the file's), and
	// checks those with the file's featureGates: a stale
	// --iptables-masquerade-bit or --detect-local-mode, or a
	// --log-text-split-stream the file's LoggingAlphaOptions allows,
	// start kube-proxy, and were refused here.
	besideConfig := o.configFile != ""
	if f := o.kubeProxy.loggingFormat; f != "" && f != "text" && f != "json" {
		add("--logging-format %q is not one of text, json", f)
	}
	if !besideConfig && !slices.Contains(detectLocalModes, o.kubeProxy.detectLocalMode) {
		add("--detect-local-mode %q is not one of %s", o.kubeProxy.detectLocalMode, strings.Join(detectLocalModes[1:], ", "))
	}
	// The rest of kube-proxy's validation of these flags' values, which
	// it runs on the configuration its flags write: as for --config's
	// fields (--iptables-masquerade-bit=99 started here).
	flagsConfig := o.kubeProxyFlagsConfig()
	if besideConfig {
		flagsConfig.FeatureGates = gatesOn(o.configFeatureGates, o.kubeProxy.featureGates)
		// --vmodule is checked with the format in force, the file's
		// unless --logging-format is given: the file's json refuses it,
		// as kube-proxy does (it started here).
		flagsConfig.Logging.Format = o.configLoggingFormat
	}
	for _, e := range kubeProxyFieldErrors(flagsConfig) {
		if besideConfig && !strings.HasPrefix(e.Field, "logging.") {
			continue
		}
		flag, ok := kubeProxyFieldFlags[e.Field]
		if !ok {
			flag = kubeProxyFieldFlags[strings.TrimRight(e.Field, "[0123456789]")]
		}
		if flag == "" {
			continue // checked above, in this proxy's words
		}
		e.Field = flag
		add("%s", oneLine(clip.Quoted(e.Error())))
	}
	for _, p := range []struct {
		flag string
		port int32
		addr *string
	}{{"--healthz-port", o.healthzPort, &o.healthzBindAddress}, {"--metrics-port", o.metricsPort, &o.metricsBindAddress}} {
		switch {
		case p.port < 0 || p.port > 65535:
			add("%s must be a port 0-65535, got %d", p.flag, p.port)
		case p.port == 0:
			*p.addr = ""
		default:
			*p.addr = withDefaultPort(*p.addr, strconv.Itoa(int(p.port)))
		}
	}
}

// ignoredFlagsGiven names the flags of kubeProxyFlags given on the command
// line whose value this proxy does not act on.
func ignoredFlagsGiven(fs *pflag.FlagSet) []string {
	var out []string
	fs.Visit(func(f *pflag.Flag) {
		if f.Annotations[ignoredFlagAnnotation] == nil {
			return
		}
		if f.Name == "detect-local-mode" && (f.Value.String() == "" || f.Value.String() == "ClusterCIDR") {
			return
		}
		if f.Name == "logging-format" && f.Value.String() == "text" {
			return
		}
		out = append(out, "--"+f.Name)
	})
	return out
}

// logIgnoredFlags says once, at start, which flags given are not acted on,
// as applyConfig does for --config's fields.
func logIgnoredFlags(fs *pflag.FlagSet) {
	if flags := ignoredFlagsGiven(fs); len(flags) > 0 {
		klog.InfoS("Ignoring flags this proxy does not act on (kube-proxy's; a userspace proxy has no use for them, or they are not built)", "flags", flags)
	}
}

// flagUsages is --help's list of flags: this proxy's, then kube-proxy's
// that it accepts and does not act on, in a section of their own.
func flagUsages(fs *pflag.FlagSet) string {
	own := pflag.NewFlagSet("own", pflag.ContinueOnError)
	ignored := pflag.NewFlagSet("ignored", pflag.ContinueOnError)
	own.SortFlags, ignored.SortFlags = false, false
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Annotations[ignoredFlagAnnotation] != nil {
			ignored.AddFlag(f)
		} else {
			own.AddFlag(f)
		}
	})
	return fmt.Sprintf("%s\nkube-proxy flags accepted and not acted on (each given is named in a log line at start):\n%s", own.FlagUsages(), ignored.FlagUsages())
}

// kubeProxyFlagsConfig is the configuration kube-proxy's flags above
// write, for kubeProxyFieldErrors.
func (o *options) kubeProxyFlagsConfig() *kubeproxyconfig.KubeProxyConfiguration {
	k := &o.kubeProxy
	duration := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	c := &kubeproxyconfig.KubeProxyConfiguration{
		FeatureGates:    k.featureGates,
		Mode:            kubeproxyconfig.ProxyMode(o.proxyMode),
		OOMScoreAdj:     &k.oomScoreAdj,
		DetectLocalMode: kubeproxyconfig.LocalMode(k.detectLocalMode),
		DetectLocal:     kubeproxyconfig.DetectLocalConfiguration{BridgeInterface: k.podBridgeInterface, InterfaceNamePrefix: k.podInterfaceNamePrefix},
		IPTables:        kubeproxyconfig.KubeProxyIPTablesConfiguration{MasqueradeBit: &k.masqueradeBit},
		IPVS: kubeproxyconfig.KubeProxyIPVSConfiguration{ExcludeCIDRs: k.ipvsExcludeCIDRs,
			TCPTimeout: *duration(k.ipvsTCP), TCPFinTimeout: *duration(k.ipvsTCPFin), UDPTimeout: *duration(k.ipvsUDP)},
		Conntrack: kubeproxyconfig.KubeProxyConntrackConfiguration{MaxPerCore: &k.conntrackMaxPerCore, Min: &k.conntrackMin,
			TCPEstablishedTimeout: duration(k.conntrackTCPEstablished), TCPCloseWaitTimeout: duration(k.conntrackTCPCloseWait),
			UDPTimeout: *duration(k.conntrackUDP), UDPStreamTimeout: *duration(k.conntrackUDPStream)},
	}
	c.Logging.Format = k.loggingFormat
	c.Logging.VModule = vmoduleConfig(o.vmoduleFlag)
	c.Logging.FlushFrequency.Duration.Duration = k.logFlushFrequency
	c.Logging.FlushFrequency.SerializeAsString = true // "-1s" in a message, not -1000000000
	c.Logging.Options.Text.SplitStream, c.Logging.Options.Text.InfoBufferSize = k.logTextSplitStream, k.logTextInfoBuffer
	c.Logging.Options.JSON.SplitStream, c.Logging.Options.JSON.InfoBufferSize = k.logJSONSplitStream, k.logJSONInfoBuffer
	return c
}

// gatesOn is file's feature gates with those flag turns on: kube-proxy
// takes the file's beside --config, and this proxy's flags win, so a
// gate either turns on is on (no command line either would start with is
// refused).
func gatesOn(file, flag map[string]bool) map[string]bool {
	gates := maps.Clone(file)
	for name, on := range flag {
		if _, set := gates[name]; !set || on {
			if gates == nil {
				gates = map[string]bool{}
			}
			gates[name] = on
		}
	}
	return gates
}

// kubeProxyFieldFlags names the flag of each field kubeProxyFlagsConfig
// sets ("": one validateKubeProxyFlags checks in its own words); a list
// item's field is its list's.
var kubeProxyFieldFlags = map[string]string{
	"featureGates":                        "--feature-gates",
	"oomScoreAdj":                         "--oom-score-adj",
	"detectLocalMode":                     "",
	"detectLocal.bridgeInterface":         "--pod-bridge-interface",
	"detectLocal.interfaceNamePrefix":     "--pod-interface-name-prefix",
	"iptables.masqueradeBit":              "--iptables-masquerade-bit",
	"ipvs.excludeCIDRs":                   "--ipvs-exclude-cidrs",
	"ipvs.tcpTimeout":                     "--ipvs-tcp-timeout",
	"ipvs.tcpFinTimeout":                  "--ipvs-tcpfin-timeout",
	"ipvs.udpTimeout":                     "--ipvs-udp-timeout",
	"conntrack.maxPerCore":                "--conntrack-max-per-core",
	"conntrack.min":                       "--conntrack-min",
	"conntrack.tcpEstablishedTimeout":     "--conntrack-tcp-timeout-established",
	"conntrack.tcpCloseWaitTimeout":       "--conntrack-tcp-timeout-close-wait",
	"conntrack.udpTimeout":                "--conntrack-udp-timeout",
	"conntrack.udpStreamTimeout":          "--conntrack-udp-timeout-stream",
	"logging.format":                      "",
	"logging.vmodule":                     "--vmodule",
	"logging.flushFrequency":              "--log-flush-frequency",
	"logging.options.text.splitStream":    "--log-text-split-stream",
	"logging.options.text.infoBufferSize": "--log-text-info-buffer-size",
	"logging.options.json.splitStream":    "--log-json-split-stream",
	"logging.options.json.infoBufferSize": "--log-json-info-buffer-size",
}
