package main

import (
	"os"

	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/component-base/metrics/prometheus/slis"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// configzGroup is the key kube-proxy's /configz puts its configuration under.
const configzGroup = "kubeproxy.config.k8s.io"

// effectiveConfig is the configuration the proxy runs with, after --config
// and the flags, in --config's own shape, so /configz can be read back as
// a --config file.
func (o *options) effectiveConfig() configFile {
	c := kubeproxyconfig.KubeProxyConfiguration{
		TypeMeta:            metav1.TypeMeta{APIVersion: configAPIVersion, Kind: "KubeProxyConfiguration"},
		BindAddress:         o.bindAddress,
		HealthzBindAddress:  o.healthzBindAddress,
		MetricsBindAddress:  o.metricsBindAddress,
		HostnameOverride:    strings.ToLower(strings.TrimSpace(o.hostnameOverride)), // as kube-proxy stores it
		Mode:                kubeproxyconfig.ProxyMode(o.proxyMode),
		PortRange:           o.proxyPortRange,
		NodePortAddresses:   o.nodePortAddresses,
		ClusterCIDR:         o.clusterCIDR,
		BindAddressHardFail: o.bindAddressHardFail,
		// The one mode there is (kube-proxy's default, shown defaulted).
		DetectLocalMode:  "ClusterCIDR",
		ConfigSyncPeriod: metav1.Duration{Duration: o.configSyncPeriod},
	}
	c.ClientConnection.Kubeconfig = o.kubeconfig
	c.ClientConnection.QPS, c.ClientConnection.Burst = o.kubeAPIQPS, int32(o.kubeAPIBurst)
	// What the client sends, as kube-proxy's defaults are shown: they
	// read "" and the client used protobuf.
	c.ClientConnection.ContentType = o.kubeAPIContentType
	if c.ClientConnection.ContentType == "" {
		c.ClientConnection.ContentType = config.ContentType
	}
	// What the client asks for (client-go's Accept without one set).
	c.ClientConnection.AcceptContentTypes = o.acceptContentTypes()
	if c.ClientConnection.AcceptContentTypes == "" {
		c.ClientConnection.AcceptContentTypes = c.ClientConnection.ContentType + ", */*"
	}
	c.IPTables.SyncPeriod = metav1.Duration{Duration: o.syncPeriod}
	c.IPTables.MinSyncPeriod = metav1.Duration{Duration: o.effectiveMinSyncPeriod()}
	// klog's -v in force, as kube-proxy's /configz shows its logging
	// configuration (it showed 0 whatever -v or logging.verbosity said).
	c.Logging.Verbosity = logsapi.VerbosityLevel(o.logVerbosity)
	c.Logging.VModule = vmoduleConfig(o.logVModule)
	// The logging defaults kube-proxy's /configz shows (component-base's
	// recommended configuration), which are in force here too: text
	// output, klog's flush every 5 s (it showed 0 and no format).
	c.Logging.Format = "text"
	c.Logging.FlushFrequency = logsapi.TimeOrMetaDuration{Duration: metav1.Duration{Duration: 5 * time.Second}, SerializeAsString: true}
	return configFile{KubeProxyConfiguration: c, UDPIdleTimeout: &metav1.Duration{Duration: o.udpTimeout}}
}

// vmoduleConfig is klog's -vmodule value (pattern=N,...; klog has checked
// it) as a configuration's logging.vmodule.
func vmoduleConfig(flag string) logsapi.VModuleConfiguration {
	var out logsapi.VModuleConfiguration
	for item := range strings.SplitSeq(flag, ",") {
		pattern, level, ok := strings.Cut(item, "=")
		n, err := strconv.ParseUint(level, 10, 32)
		if !ok || err != nil || pattern == "" {
			continue
		}
		out = append(out, logsapi.VModuleItem{FilePattern: pattern, Verbosity: logsapi.VerbosityLevel(n)})
	}
	return out
}

// configzHandler serves /configz as kube-proxy does:
// {"kubeproxy.config.k8s.io": {...the effective configuration...}}.
func configzHandler(cfg configFile) http.Handler {
	body, err := json.Marshal(map[string]any{configzGroup: cfg})
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(body)
	})
}

// pingHandler is the metrics server's /healthz: kube-proxy installs the
// generic apiserver health handler there (healthz.InstallHandler, its one
// check "ping"), which answers "ok" while the process serves HTTP, with
// ?verbose the checks ("[+]ping ok", "healthz check passed"), and honours
// ?exclude=; each ping it runs (not excluded) is counted in the SLI
// metrics (/metrics/slis), as there. (Whether rules are in sync is the
// health server's /healthz.)
func pingHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		q := r.URL.Query()
		pingExcluded := slices.Contains(q["exclude"], "ping")
		if !pingExcluded {
			_ = slis.ObserveHealthcheck(r.Context(), "ping", "healthz", slis.Success)
		}
		if _, verbose := q["verbose"]; !verbose {
			_, _ = w.Write([]byte("ok"))
			return
		}
		var out strings.Builder
		var unknown []string
		for _, name := range q["exclude"] {
			if name != "ping" && !slices.Contains(unknown, name) {
				unknown = append(unknown, name)
			}
		}
		if pingExcluded {
			out.WriteString("[+]ping excluded: ok\n")
		} else {
			out.WriteString("[+]ping ok\n")
		}
		if len(unknown) > 0 {
			slices.Sort(unknown)
			quoted := make([]string, len(unknown))
			for i, n := range unknown {
				quoted[i] = strconv.Quote(n)
			}
			fmt.Fprintf(&out, "warn: some health checks cannot be excluded: no matches for %s\n", strings.Join(quoted, ","))
		}
		out.WriteString("healthz check passed\n")
		_, _ = w.Write([]byte(out.String()))
	})
}

// pingCheckHandler is the metrics server's /healthz/ping, the ping
// check's own path, as kube-proxy's healthz.InstallHandler serves it.
func pingCheckHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})
}

// writeConfig writes effectiveConfig to path as YAML, which --config reads
// back (--write-config-to, kube-proxy's way to start a configuration file)
// as the same configuration, given the same flags of this proxy's own.
func (o *options) writeConfig(path string) error {
	c := o.effectiveConfig()
	// The value given, not the one in force: read back, one derived from
	// the content type would outlive a change of the content type.
	c.ClientConnection.AcceptContentTypes = o.kubeAPIAcceptContentTypes
	// A disabled server, "" in force, is defaulted when read back, by
	// kube-proxy as here: it came back on.
	c.HealthzBindAddress = disabledIfEmpty(c.HealthzBindAddress)
	c.MetricsBindAddress = disabledIfEmpty(c.MetricsBindAddress)
	data, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// serverDisabled is a --config healthzBindAddress or metricsBindAddress
// that turns the server off, which kube-proxy's files cannot say (empty
// means the default address). kube-proxy refuses it as not HOST:PORT
// rather than serving where this proxy was told not to.
const serverDisabled = "disabled"

func disabledIfEmpty(addr string) string {
	if addr == "" {
		return serverDisabled
	}
	return addr
}

// serverAddress is the address a --config bind-address field gives.
func serverAddress(field string) string {
	if field == serverDisabled {
		return ""
	}
	return field
}
