package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
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
	var cfg configFile
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return fmt.Errorf("decoding: %v", err)
	}
	if cfg.APIVersion != configAPIVersion || cfg.Kind != "KubeProxyConfiguration" {
		return fmt.Errorf("want apiVersion %s, kind KubeProxyConfiguration; got %q, %q", configAPIVersion, cfg.APIVersion, cfg.Kind)
	}
	set := func(flag string, present bool, apply func()) {
		if present && !fs.Changed(flag) {
			apply()
		}
	}
	duration := func(flag string, d metav1.Duration, dst *time.Duration) {
		set(flag, d.Duration != 0, func() { *dst = d.Duration })
	}
	c := &cfg.KubeProxyConfiguration
	set("kubeconfig", c.ClientConnection.Kubeconfig != "", func() {
		o.kubeconfig = c.ClientConnection.Kubeconfig
		o.kubeconfigField = fmt.Sprintf("clientConnection.kubeconfig (set in --config %s)", o.configFile)
	})
	set("bind-address", c.BindAddress != "", func() { o.bindAddress = c.BindAddress })
	set("healthz-bind-address", c.HealthzBindAddress != "", func() { o.healthzBindAddress = c.HealthzBindAddress })
	set("metrics-bind-address", c.MetricsBindAddress != "", func() { o.metricsBindAddress = c.MetricsBindAddress })
	set("hostname-override", c.HostnameOverride != "", func() { o.hostnameOverride = c.HostnameOverride })
	set("proxy-mode", c.Mode != "", func() { o.proxyMode = strings.TrimSpace(string(c.Mode)) })
	set("proxy-port-range", c.PortRange != "", func() { o.proxyPortRange = c.PortRange })
	set("nodeport-addresses", len(c.NodePortAddresses) > 0, func() { o.nodePortAddresses = c.NodePortAddresses })
	duration("iptables-sync-period", c.IPTables.SyncPeriod, &o.syncPeriod)
	duration("iptables-min-sync-period", c.IPTables.MinSyncPeriod, &o.minSyncPeriod)
	duration("config-sync-period", c.ConfigSyncPeriod, &o.configSyncPeriod)
	if cfg.UDPIdleTimeout != nil {
		duration("udp-timeout", *cfg.UDPIdleTimeout, &o.udpTimeout)
	}
	return nil
}
