package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// configFile is a KubeProxyConfiguration plus the legacy userspace field
// udpIdleTimeout, which kube-proxy dropped with the userspace mode but
// existing configurations for this mode still carry.
type configFile struct {
	kubeproxyconfig.KubeProxyConfiguration `json:",inline"`
	UDPIdleTimeout                         *metav1.Duration `json:"udpIdleTimeout,omitempty"`
}

const configAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"

// applyConfigFile loads --config into o. As in kube-proxy, a flag given on
// the command line wins over the file; unknown fields are an error.
func (o *options) applyConfigFile(fs *pflag.FlagSet) error {
	data, err := os.ReadFile(o.configFile)
	if err != nil {
		return err
	}
	cfg, err := decodeConfigFile(data)
	if err != nil {
		return err
	}
	o.applyConfig(cfg, fs)
	return nil
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
	set("healthz-bind-address", "healthzBindAddress", c.HealthzBindAddress != "", func() { o.healthzBindAddress = c.HealthzBindAddress })
	set("metrics-bind-address", "metricsBindAddress", c.MetricsBindAddress != "", func() { o.metricsBindAddress = c.MetricsBindAddress })
	set("hostname-override", "hostnameOverride", c.HostnameOverride != "", func() { o.hostnameOverride = c.HostnameOverride })
	set("proxy-mode", "mode", c.Mode != "", func() { o.proxyMode = strings.TrimSpace(string(c.Mode)) })
	set("proxy-port-range", "portRange", c.PortRange != "", func() { o.proxyPortRange = c.PortRange })
	set("cluster-cidr", "clusterCIDR", c.ClusterCIDR != "", func() { o.clusterCIDR = c.ClusterCIDR })
	set("nodeport-addresses", "nodePortAddresses", len(c.NodePortAddresses) > 0, func() { o.nodePortAddresses = c.NodePortAddresses })
	duration("iptables-sync-period", "iptables.syncPeriod", c.IPTables.SyncPeriod, &o.syncPeriod)
	duration("iptables-min-sync-period", "iptables.minSyncPeriod", c.IPTables.MinSyncPeriod, &o.minSyncPeriod)
	duration("config-sync-period", "configSyncPeriod", c.ConfigSyncPeriod, &o.configSyncPeriod)
	if cfg.UDPIdleTimeout != nil {
		duration("udp-timeout", "udpIdleTimeout", *cfg.UDPIdleTimeout, &o.udpTimeout)
	}
	// klog's -v, as kube-proxy applies logging.verbosity from its file,
	// when the flag set carries it (runMain's does; a number always sets).
	// It was ignored: a node configured for verbosity 4 logged at 0.
	set("v", "logging.verbosity", c.Logging.Verbosity != 0 && fs.Lookup("v") != nil, func() {
		_ = fs.Set("v", strconv.FormatUint(uint64(c.Logging.Verbosity), 10))
	})
	// logging.vmodule likewise sets klog's -vmodule (per-file verbosity).
	set("vmodule", "logging.vmodule", len(c.Logging.VModule) > 0 && fs.Lookup("vmodule") != nil, func() {
		items := make([]string, 0, len(c.Logging.VModule))
		for _, it := range c.Logging.VModule {
			items = append(items, fmt.Sprintf("%s=%d", it.FilePattern, it.Verbosity))
		}
		_ = fs.Set("vmodule", strings.Join(items, ","))
	})
	// kube-proxy can also log JSON; this proxy logs klog's text only, and
	// says so instead of starting as if the file had been followed.
	if f := c.Logging.Format; f != "" && f != "text" {
		klog.InfoS("Ignoring logging.format in --config: only the text format is supported", "format", f, "config", o.configFile)
	}
}
