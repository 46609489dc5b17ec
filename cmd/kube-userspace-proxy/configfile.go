package main

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/regularfile"
)

// configFile is a KubeProxyConfiguration plus the legacy userspace field
// udpIdleTimeout, which kube-proxy dropped with the userspace mode but
// existing configurations for this mode still carry.
type configFile struct {
	kubeproxyconfig.KubeProxyConfiguration `json:",inline"`
	UDPIdleTimeout                         *metav1.Duration `json:"udpIdleTimeout,omitempty"`
}

const configAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"

// applyConfigFile loads --config into o. A flag given on the command line
// wins over the file: this project's choice, which the README states.
// kube-proxy does the opposite: with --config its other flags are ignored
// (the file wins), save the logging flags and --hostname-override. Unknown
// fields are an error; a value kube-proxy's validation refuses
// (validateConfigFields) is one too, which validate reports with the
// others.
func (o *options) applyConfigFile(fs *pflag.FlagSet) error {
	data, err := readConfigFile(o.configFile)
	if err != nil {
		return err
	}
	return o.applyConfigData(data, fs)
}

// maxConfigFileSize bounds --config: a ConfigMap holds at most 1 MiB, and
// a KubeProxyConfiguration a few KiB.
const maxConfigFileSize = 1 << 20

// readConfigFile reads --config, at start and when polled, through
// regularfile.Read: a FIFO renamed over it blocked the poll for good (no
// change seen again), and a sparse 1 TiB file was allocated whole, which
// killed the proxy. Its error says why, not which file: each caller names
// it ("--config PATH: ...", the poll's log its "config" key), and a
// PathError's path made the start's message say it twice.
func readConfigFile(path string) ([]byte, error) {
	data, err := regularfile.Read(path, maxConfigFileSize, nil)
	return data, statReason(err)
}

// applyConfigData is applyConfigFile on the file's content data.
func (o *options) applyConfigData(data []byte, fs *pflag.FlagSet) error {
	cfg, err := decodeConfigFile(data)
	if err != nil {
		return err
	}
	merged, overlaid := o.withLoggingFlags(&cfg.KubeProxyConfiguration, fs)
	o.configFieldErrors = validateConfigFields(merged, overlaid)
	o.configLoaded = data
	o.configFeatureGates = cfg.FeatureGates
	o.configLoggingFormat = merged.Logging.Format
	o.applyConfig(cfg, fs)
	return nil
}

// withLoggingFlags is c with the logging flags given on the command line
// over its logging, which kube-proxy validates so (copyLogsFromFlags, then
// its file's validation), and the fields they set: a file's logging
// {format: json, vmodule: [...]} with --logging-format=text starts
// kube-proxy, and was refused here ("logging.vmodule: Forbidden"). The
// flags' own values are validateKubeProxyFlags' to check, naming the flag.
// Before applyConfig, which sets --vmodule from the file.
func (o *options) withLoggingFlags(c *kubeproxyconfig.KubeProxyConfiguration, fs *pflag.FlagSet) (*kubeproxyconfig.KubeProxyConfiguration, map[string]bool) {
	merged := c.DeepCopy()
	flags := o.kubeProxyFlagsConfig().Logging
	overlaid := map[string]bool{}
	over := func(flag, field string, apply func()) {
		if fs.Changed(flag) {
			apply()
			overlaid[field] = true
		}
	}
	lg := &merged.Logging
	over("logging-format", "logging.format", func() { lg.Format = flags.Format })
	over("log-flush-frequency", "logging.flushFrequency", func() { lg.FlushFrequency = flags.FlushFrequency })
	over("log-text-split-stream", "logging.options.text.splitStream", func() { lg.Options.Text.SplitStream = flags.Options.Text.SplitStream })
	over("log-text-info-buffer-size", "logging.options.text.infoBufferSize", func() { lg.Options.Text.InfoBufferSize = flags.Options.Text.InfoBufferSize })
	over("log-json-split-stream", "logging.options.json.splitStream", func() { lg.Options.JSON.SplitStream = flags.Options.JSON.SplitStream })
	over("log-json-info-buffer-size", "logging.options.json.infoBufferSize", func() { lg.Options.JSON.InfoBufferSize = flags.Options.JSON.InfoBufferSize })
	if f := fs.Lookup("vmodule"); f != nil {
		over("vmodule", "logging.vmodule", func() { lg.VModule = append(vmoduleConfig(f.Value.String()), lg.VModule...) })
	}
	return merged, overlaid
}

// applyConfig sets the options the file gives and no flag overrides, and
// remembers which field set each so that validation blames the field.
func (o *options) applyConfig(cfg *configFile, fs *pflag.FlagSet) {
	set := func(flag, field string, present bool, apply func()) {
		if present && !fs.Changed(flag) {
			apply()
			if o.fileFields == nil {
				o.fileFields = map[string]string{}
			}
			o.fileFields[flag] = field
		}
	}
	duration := func(flag, field string, d metav1.Duration, dst *time.Duration) {
		set(flag, field, d.Duration != 0, func() { *dst = d.Duration })
	}
	c := &cfg.KubeProxyConfiguration
	set("kubeconfig", "clientConnection.kubeconfig", c.ClientConnection.Kubeconfig != "", func() {
		o.kubeconfig = c.ClientConnection.Kubeconfig
		o.kubeconfigField = fmt.Sprintf("clientConnection.kubeconfig (set in --config %s)", o.configFile)
	})
	set("bind-address", "bindAddress", c.BindAddress != "", func() { o.bindAddress = c.BindAddress })
	set("healthz-bind-address", "healthzBindAddress", c.HealthzBindAddress != "", func() { o.healthzBindAddress = serverAddress(c.HealthzBindAddress) })
	set("metrics-bind-address", "metricsBindAddress", c.MetricsBindAddress != "", func() { o.metricsBindAddress = serverAddress(c.MetricsBindAddress) })
	// kube-proxy defaults the servers' addresses from the family of the
	// bind address (getDefaultAddresses): an IPv6 node configured with
	// bindAddress '::1' kept metrics on 127.0.0.1. The effective one, a
	// --bind-address flag's over the file's, as kube-proxy's flags write
	// into the same configuration.
	if a, err := netip.ParseAddr(o.bindAddress); err == nil && !a.Unmap().Is4() {
		if c.HealthzBindAddress == "" && !fs.Changed("healthz-bind-address") {
			o.healthzBindAddress = net.JoinHostPort("::", defaultHealthzPort)
		}
		if c.MetricsBindAddress == "" && !fs.Changed("metrics-bind-address") {
			o.metricsBindAddress = net.JoinHostPort("::1", defaultMetricsPort)
		}
	}
	set("bind-address-hard-fail", "bindAddressHardFail", c.BindAddressHardFail, func() { o.bindAddressHardFail = true })
	set("hostname-override", "hostnameOverride", c.HostnameOverride != "", func() { o.hostnameOverride = c.HostnameOverride })
	set("proxy-mode", "mode", c.Mode != "", func() { o.proxyMode = strings.TrimSpace(string(c.Mode)) })
	set("proxy-port-range", "portRange", c.PortRange != "", func() { o.proxyPortRange = c.PortRange })
	set("cluster-cidr", "clusterCIDR", c.ClusterCIDR != "", func() { o.clusterCIDR = c.ClusterCIDR })
	set("nodeport-addresses", "nodePortAddresses", len(c.NodePortAddresses) > 0, func() { o.nodePortAddresses = c.NodePortAddresses })
	duration("iptables-sync-period", "iptables.syncPeriod", c.IPTables.SyncPeriod, &o.syncPeriod)
	duration("iptables-min-sync-period", "iptables.minSyncPeriod", c.IPTables.MinSyncPeriod, &o.minSyncPeriod)
	duration("config-sync-period", "configSyncPeriod", c.ConfigSyncPeriod, &o.configSyncPeriod)
	cc := c.ClientConnection
	set("kube-api-qps", "clientConnection.qps", cc.QPS != 0, func() { o.kubeAPIQPS = cc.QPS })
	set("kube-api-burst", "clientConnection.burst", cc.Burst != 0, func() { o.kubeAPIBurst = int(cc.Burst) })
	set("kube-api-content-type", "clientConnection.contentType", cc.ContentType != "", func() { o.kubeAPIContentType = cc.ContentType })
	// No flag sets it, as in kube-proxy: the file's, as kube-proxy's
	// createClient applies it (it was named as not acted on).
	o.kubeAPIAcceptContentTypes = cc.AcceptContentTypes
	if cfg.UDPIdleTimeout != nil {
		duration("udp-timeout", "udpIdleTimeout", *cfg.UDPIdleTimeout, &o.udpTimeout)
	}
	// klog's -v, as kube-proxy applies logging.verbosity from its file,
	// when the flag set carries it (runMain's does; a number always sets).
	// It was ignored: a node configured for verbosity 4 logged at 0.
	set("v", "logging.verbosity", c.Logging.Verbosity != 0 && fs.Lookup("v") != nil, func() {
		_ = fs.Set("v", strconv.FormatUint(uint64(c.Logging.Verbosity), 10))
	})
	// logging.vmodule likewise sets klog's -vmodule (per-file verbosity);
	// after a --vmodule given, as kube-proxy joins them (copyLogsFromFlags):
	// klog takes a file's first match, so the flag's win where both name
	// one, and the file's others still apply (they were dropped).
	if f := fs.Lookup("vmodule"); f != nil && len(c.Logging.VModule) > 0 {
		items := make([]string, 0, 1+len(c.Logging.VModule))
		for _, it := range c.Logging.VModule {
			items = append(items, fmt.Sprintf("%s=%d", it.FilePattern, it.Verbosity))
		}
		given := fs.Changed("vmodule")
		if v := f.Value.String(); given && v != "" {
			items = append([]string{v}, items...)
		}
		joined := strings.Join(items, ",")
		if given {
			_ = fs.Set("vmodule", joined)
		} else {
			set("vmodule", "logging.vmodule", true, func() { _ = fs.Set("vmodule", joined) })
		}
	}
	// kube-proxy can also log JSON; this proxy logs klog's text only, and
	// says so instead of starting as if the file had been followed.
	if f := c.Logging.Format; f != "" && f != "text" {
		klog.InfoS("Ignoring logging.format in --config: only the text format is supported", "format", f, "config", o.configFile)
	}
	if fields := ignoredConfigFields(c); len(fields) > 0 {
		klog.InfoS("Ignoring --config fields this proxy does not implement (a userspace proxy has no use for them, or they are not built)",
			"fields", fields, "config", o.configFile)
	}
}

// ignoredConfigFields names the fields of c that are set to something
// other than their default and that this proxy does not act on: they were
// accepted without a word, as if followed. Fields of the other modes
// (ipvs, nftables, winkernel) are ignored by kube-proxy too, and not named.
func ignoredConfigFields(c *kubeproxyconfig.KubeProxyConfiguration) []string {
	var out []string
	note := func(set bool, field string) {
		if set {
			out = append(out, field)
		}
	}
	note(len(c.FeatureGates) > 0, "featureGates")
	note(c.EnableProfiling, "enableProfiling")
	note(c.ShowHiddenMetricsForVersion != "", "showHiddenMetricsForVersion")
	note(c.DetectLocalMode != "" && c.DetectLocalMode != "ClusterCIDR", "detectLocalMode (only ClusterCIDR, with clusterCIDR)")
	note(c.DetectLocal != (kubeproxyconfig.DetectLocalConfiguration{}), "detectLocal")
	note(c.OOMScoreAdj != nil, "oomScoreAdj")
	ct := c.Conntrack
	note(ct.MaxPerCore != nil && *ct.MaxPerCore != 0 || ct.Min != nil && *ct.Min != 0, "conntrack.maxPerCore/min")
	note(ct.TCPEstablishedTimeout != nil && ct.TCPEstablishedTimeout.Duration != 0 ||
		ct.TCPCloseWaitTimeout != nil && ct.TCPCloseWaitTimeout.Duration != 0 ||
		ct.UDPTimeout.Duration != 0 || ct.UDPStreamTimeout.Duration != 0 || ct.TCPBeLiberal, "conntrack timeouts")
	note(c.IPTables.MasqueradeAll, "iptables.masqueradeAll")
	note(c.IPTables.MasqueradeBit != nil, "iptables.masqueradeBit")
	note(c.IPTables.LocalhostNodePorts != nil && !*c.IPTables.LocalhostNodePorts, "iptables.localhostNodePorts")
	// component-base's logging options, whose flags (--log-flush-frequency,
	// --log-text-split-stream, ...) are named when given: set in the file
	// they were ignored in silence. kubeadm writes a zero flush frequency,
	// kube-proxy's default is 5s: neither is named.
	lg := c.Logging
	note(lg.FlushFrequency.Duration.Duration != 0 && lg.FlushFrequency.Duration.Duration != 5*time.Second, "logging.flushFrequency")
	note(lg.Options.Text.SplitStream || !lg.Options.Text.InfoBufferSize.IsZero(), "logging.options.text")
	note(lg.Options.JSON.SplitStream || !lg.Options.JSON.InfoBufferSize.IsZero(), "logging.options.json")
	return out
}
