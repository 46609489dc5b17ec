package main

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

func TestConfigFile(t *testing.T) {
	const full = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: userspace
bindAddress: 10.0.0.5
healthzBindAddress: 0.0.0.0:10266
metricsBindAddress: 127.0.0.1:10259
hostnameOverride: node-a
clientConnection: {kubeconfig: /etc/kube/proxy.conf}
iptables: {syncPeriod: 20s, minSyncPeriod: 2s}
configSyncPeriod: 10m
portRange: 30000-30099
nodePortAddresses: [10.0.0.0/8]
udpIdleTimeout: 3s
`
	tests := []struct {
		name    string
		file    string
		args    []string
		check   func(t *testing.T, o *options)
		wantErr string
	}{
		{name: "every mapped field", file: full, check: func(t *testing.T, o *options) {
			if o.bindAddress != "10.0.0.5" || o.healthzBindAddress != "0.0.0.0:10266" || o.metricsBindAddress != "127.0.0.1:10259" ||
				o.hostnameOverride != "node-a" || o.kubeconfig != "/etc/kube/proxy.conf" || o.syncPeriod != 20*time.Second ||
				o.minSyncPeriod != 2*time.Second || o.configSyncPeriod != 10*time.Minute || o.proxyPortRange != "30000-30099" ||
				len(o.nodePortAddresses) != 1 || o.udpTimeout != 3*time.Second {
				t.Fatalf("options not taken from file: %+v", o)
			}
		}},
		{name: "flags win over the file", file: full, args: []string{"--udp-timeout=1s", "--bind-address=0.0.0.0"}, check: func(t *testing.T, o *options) {
			if o.udpTimeout != time.Second || o.bindAddress != "0.0.0.0" || o.syncPeriod != 20*time.Second {
				t.Fatalf("flag precedence wrong: udp %v bind %s sync %v", o.udpTimeout, o.bindAddress, o.syncPeriod)
			}
		}},
		// kube-proxy's defaulting (getDefaultAddresses): an IPv6 bindAddress
		// makes the servers' default addresses IPv6; metrics stayed on
		// 127.0.0.1.
		{name: "IPv6 bindAddress defaults the servers to IPv6", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddress: '::1'\n",
			check: func(t *testing.T, o *options) {
				if o.healthzBindAddress != "[::]:10256" || o.metricsBindAddress != "[::1]:10249" {
					t.Fatalf("healthz %q, metrics %q; want kube-proxy's [::]:10256, [::1]:10249", o.healthzBindAddress, o.metricsBindAddress)
				}
			}},
		{name: "an IPv4 --bind-address over the file's IPv6 one keeps the IPv4 defaults", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddress: '::'\n",
			args: []string{"--bind-address=10.0.0.5"},
			check: func(t *testing.T, o *options) {
				if o.bindAddress != "10.0.0.5" || o.healthzBindAddress != "0.0.0.0:10256" || o.metricsBindAddress != "127.0.0.1:10249" {
					t.Fatalf("bind %q, healthz %q, metrics %q; want 10.0.0.5, 0.0.0.0:10256, 127.0.0.1:10249", o.bindAddress, o.healthzBindAddress, o.metricsBindAddress)
				}
			}},
		{name: "IPv4 bindAddress keeps the IPv4 defaults", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddress: 10.0.0.5\n",
			check: func(t *testing.T, o *options) {
				if o.healthzBindAddress != "0.0.0.0:10256" || o.metricsBindAddress != "127.0.0.1:10249" {
					t.Fatalf("healthz %q, metrics %q; want 0.0.0.0:10256, 127.0.0.1:10249", o.healthzBindAddress, o.metricsBindAddress)
				}
			}},
		{name: "IPv6 bindAddress, the servers' addresses given", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddress: 'fd00::5'\nmetricsBindAddress: 127.0.0.1:9000\n",
			args: []string{"--healthz-bind-address=127.0.0.1:9001"},
			check: func(t *testing.T, o *options) {
				if o.healthzBindAddress != "127.0.0.1:9001" || o.metricsBindAddress != "127.0.0.1:9000" {
					t.Fatalf("healthz %q, metrics %q; want the flag's 127.0.0.1:9001 and the file's 127.0.0.1:9000", o.healthzBindAddress, o.metricsBindAddress)
				}
			}},
		{name: "unknown field", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbogus: 1\n", wantErr: "bogus"},
		{name: "misspelt field: the one meant", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAdress: 1.2.3.4\n",
			wantErr: `unknown field "bindAdress": did you mean "bindAddress"?`},
		{name: "misspelt nested field: the one meant", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables: {syncPerod: 1s}\n",
			wantErr: `unknown field "iptables.syncPerod": did you mean "iptables.syncPeriod"?`},
		{name: "bad duration names its field", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables: {syncPeriod: abc}\n",
			wantErr: `iptables.syncPeriod: time: invalid duration "abc"`},
		// A duration written as a bare number (YAML's 30, not "30s") was
		// "cannot unmarshal number into a value of type string", which does
		// not say that a duration with a unit is wanted.
		{name: "a duration given as a number says a duration is wanted", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables: {syncPeriod: 30}\n",
			wantErr: `iptables.syncPeriod: must be a duration with a unit, such as "30s" or "1m", not 30`},
		{name: "a duration given as a boolean says a duration is wanted", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nudpIdleTimeout: true\n",
			wantErr: `udpIdleTimeout: must be a duration with a unit, such as "30s" or "1m", not true`},
		{name: "a string field given a number keeps the decoder's words", file: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddress: 5\n",
			wantErr: `bindAddress: cannot unmarshal number into a value of type string`},
		{name: "wrong kind", file: "apiVersion: v1\nkind: ConfigMap\n", wantErr: "KubeProxyConfiguration"},
		{name: "a second document", file: full + "---\napiVersion: v1\nkind: Service\n",
			wantErr: "document: expected one KubeProxyConfiguration, but a second document starts at line 15"},
		{name: "two configurations", file: "---\n" + full + "---\n# the old one\n" + full, wantErr: "a second document starts at line 17"},
		{name: "separators and comments around one document", file: "# proxy\n---\n" + full + "--- # end\n# nothing more\n---\n",
			check: func(t *testing.T, o *options) {
				if o.bindAddress != "10.0.0.5" || o.udpTimeout != 3*time.Second {
					t.Fatalf("options not taken from file: %+v", o)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(path, []byte(tt.file), 0o644); err != nil {
				t.Fatal(err)
			}
			o := newOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.addFlags(fs)
			if err := fs.Parse(append([]string{"--config", path}, tt.args...)); err != nil {
				t.Fatal(err)
			}
			err := o.applyConfigFile(fs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

// logging.verbosity and logging.vmodule set klog's -v and -vmodule unless
// given on the command line, as kube-proxy applies its file's logging
// configuration (vmodule was ignored).
func TestConfigFileVerbosity(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	for _, tt := range []struct {
		name  string
		file  string
		args  []string
		wantV string
	}{
		{"from the file", "logging: {verbosity: 4}\n", nil, "4"},
		{"the flag wins", "logging: {verbosity: 4}\n", []string{"-v=2"}, "2"},
		{"not in the file", "logging: {format: text}\n", nil, "0"},
		{"vmodule from the file", "logging: {vmodule: [{filePattern: proxier, verbosity: 5}, {filePattern: relay*, verbosity: 3}]}\n", nil, "0"},
		// kube-proxy joins them (copyLogsFromFlags), the flag's first: klog
		// takes a file's first match, so the flag's win where both name
		// one. The file's were dropped.
		{"the vmodule flag first", "logging: {vmodule: [{filePattern: proxier, verbosity: 5}]}\n", []string{"--vmodule=faults=2"}, "0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+tt.file), 0o644); err != nil {
				t.Fatal(err)
			}
			o := newOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.addFlags(fs)
			klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
			klog.InitFlags(klogFlags) // klog's global verbosity, as runMain
			fs.AddGoFlag(klogFlags.Lookup("v"))
			fs.AddGoFlag(klogFlags.Lookup("vmodule"))
			t.Cleanup(func() { _ = klogFlags.Set("v", "0"); _ = klogFlags.Set("vmodule", "") })
			if err := fs.Parse(append([]string{"--config", path}, tt.args...)); err != nil {
				t.Fatal(err)
			}
			if err := o.applyConfigFile(fs); err != nil {
				t.Fatal(err)
			}
			wantVModule := map[string]string{
				"vmodule from the file": "proxier=5,relay*=3", "the vmodule flag first": "faults=2,proxier=5",
			}[tt.name]
			if got := klogFlags.Lookup("vmodule").Value.String(); got != wantVModule {
				t.Errorf("-vmodule %q, want %q", got, wantVModule)
			}
			if got := klogFlags.Lookup("v").Value.String(); got != tt.wantV {
				t.Errorf("-v %s, want %s", got, tt.wantV)
			}
			if n, _ := strconv.Atoi(tt.wantV); n > 0 && !klog.V(klog.Level(n)).Enabled() {
				t.Errorf("klog.V(%d) is not enabled", n)
			}
		})
	}
}

// clientConnection's qps, burst and contentType set the API client as
// kube-proxy's --kube-api-qps, --kube-api-burst and --kube-api-content-type
// do (they were accepted and ignored), unless the flag is given; fields
// this proxy does not act on are named in a log line instead of passing
// in silence.
func TestConfigFileClientConnection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"clientConnection: {qps: 20, burst: 40, contentType: application/json}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := newOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse([]string{"--config", path, "--kube-api-burst", "7"}); err != nil {
		t.Fatal(err)
	}
	if err := o.applyConfigFile(fs); err != nil {
		t.Fatal(err)
	}
	if o.kubeAPIQPS != 20 || o.kubeAPIBurst != 7 || o.kubeAPIContentType != "application/json" {
		t.Errorf("qps %v, burst %d, content type %q; want 20, 7 (the flag), application/json", o.kubeAPIQPS, o.kubeAPIBurst, o.kubeAPIContentType)
	}
}

// A negative --kube-api-qps (or clientConnection.qps) is accepted, as
// kube-proxy validates only the burst: client-go then sets no rate limiter
// at all. It was refused with exit 2.
func TestNegativeKubeAPIQPS(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"clientConnection: {qps: -1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--kube-api-qps", "-1"}, {"--config", path}} {
		o := parsedOptions(t, append([]string{"--manifests", t.TempDir()}, args...))
		if _, err := o.validate(); err != nil {
			t.Errorf("%q: refused: %v", args, err)
		}
		if o.kubeAPIQPS != -1 {
			t.Errorf("%q: qps %v, want -1", args, o.kubeAPIQPS)
		}
	}
	// What accepting it means: the client-go this proxy is built with
	// takes a negative QPS for no client-side limit.
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", QPS: -1, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	if rl := client.CoreV1().RESTClient().GetRateLimiter(); rl != nil {
		t.Errorf("client-go rate-limits a negative QPS (%T): the README's row is wrong", rl)
	}
}

func TestIgnoredConfigFields(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want []string
	}{
		// kubeadm's default file: nothing to name.
		{"mode: \"\"\nconntrack: {maxPerCore: null, min: null, tcpCloseWaitTimeout: null, tcpEstablishedTimeout: null}\n" +
			"iptables: {masqueradeAll: false, masqueradeBit: null, localhostNodePorts: null}\noomScoreAdj: null\ndetectLocalMode: \"\"\nenableProfiling: false\n", nil},
		{"detectLocalMode: ClusterCIDR\nclusterCIDR: 10.244.0.0/16\n", nil},
		// kubeadm's logging block, and kube-proxy's default flush frequency.
		{"logging: {flushFrequency: 0, options: {json: {infoBufferSize: \"0\"}, text: {infoBufferSize: \"0\"}}, verbosity: 0}\n", nil},
		{"logging: {flushFrequency: 5s}\n", nil},
		// The logging fields whose flags are named when given
		// (--log-flush-frequency, --log-text-split-stream, ...) were
		// ignored in silence when set in the file.
		{"logging: {flushFrequency: 10s, options: {text: {splitStream: true, infoBufferSize: 1Mi}, json: {splitStream: true}}}\n",
			[]string{"logging.flushFrequency", "logging.options.text", "logging.options.json"}},
		{"featureGates: {Foo: true}\nenableProfiling: true\noomScoreAdj: -999\n", []string{"featureGates", "enableProfiling", "oomScoreAdj"}},
		{"detectLocalMode: NodeCIDR\nconntrack: {maxPerCore: 32768}\niptables: {masqueradeAll: true}\n",
			[]string{"detectLocalMode (only ClusterCIDR, with clusterCIDR)", "conntrack.maxPerCore/min", "iptables.masqueradeAll"}},
	} {
		cfg, err := decodeConfigFile([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + tc.yaml))
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if got := ignoredConfigFields(&cfg.KubeProxyConfiguration); !slices.Equal(got, tc.want) {
			t.Errorf("%q: ignored %q, want %q", tc.yaml, got, tc.want)
		}
	}
}

// --write-config-to writes the configuration in force (defaults, flags)
// as a KubeProxyConfiguration and exits 0, and --config reads the file
// back (kube-proxy's flag; it was "unknown flag", exit 2).
func TestWriteConfigToReadsBack(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	args := []string{"--write-config-to", file, "--manifests", dir, "--iptables=false", "--udp-timeout", "3s", "--iptables-sync-period", "45s"}
	var code int
	stderr := capture(t, &os.Stderr, func() { code = runMain(args) })
	if code != 0 {
		t.Fatalf("runMain(%q) = %d, want 0; stderr %s", args, code, stderr)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := decodeConfigFile(data)
	if err != nil {
		t.Fatalf("the file written does not decode as --config: %v\n%s", err, data)
	}
	if cfg.UDPIdleTimeout == nil || cfg.UDPIdleTimeout.Duration != 3*time.Second || cfg.IPTables.SyncPeriod.Duration != 45*time.Second {
		t.Errorf("udpIdleTimeout %v, iptables.syncPeriod %v; want 3s and 45s:\n%s", cfg.UDPIdleTimeout, cfg.IPTables.SyncPeriod, data)
	}
	// The minimum in force, --iptables=false's 100 ms (it was the flag's
	// 1s, which read back as given and so in force).
	if got := cfg.IPTables.MinSyncPeriod.Duration; got != noRulesMinSyncPeriod {
		t.Errorf("iptables.minSyncPeriod %v, want the 100ms in force", got)
	}
	// As kube-proxy's, it needs no source.
	if code := runMain([]string{"--write-config-to", filepath.Join(dir, "bare.yaml")}); code != 0 {
		t.Errorf("--write-config-to alone: exit %d, want 0", code)
	}
	args = []string{"--config", file, "--manifests", dir, "--iptables=false", "--init-only"}
	stderr = capture(t, &os.Stderr, func() { code = runMain(args) })
	if code != 0 {
		t.Fatalf("runMain(%q) = %d, want 0; stderr %s", args, code, stderr)
	}
}

// TestWriteConfigRoundTrip: a file --write-config-to writes, read back by
// --config with the same flags of this proxy's own (those not written:
// --iptables, --manifests), gives the configuration in force it was
// written from. Disabled servers came back on (written "", which reads
// as the default), and --iptables=false's 100 ms minSyncPeriod came back
// as 1s.
func TestWriteConfigRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for i, tc := range []struct {
		written, own []string
	}{
		{nil, nil},
		{nil, []string{"--iptables=false"}},
		{[]string{"--iptables-min-sync-period", "1s"}, []string{"--iptables=false"}},
		{[]string{"--iptables-min-sync-period", "2s"}, []string{"--iptables=false"}},
		{[]string{"--healthz-bind-address=", "--metrics-bind-address="}, []string{"--iptables=false"}},
		{[]string{"--healthz-bind-address="}, nil},
		{[]string{"--metrics-port", "0"}, nil},
		{[]string{"--healthz-bind-address", "127.0.0.1", "--metrics-bind-address", "[::1]:9999"}, nil},
		{[]string{"--bind-address", "::1"}, []string{"--iptables=false"}},
		{[]string{"--bind-address", "::1", "--healthz-bind-address=", "--metrics-bind-address="}, []string{"--iptables=false"}},
		{[]string{"--iptables-sync-period", "45s", "--iptables-min-sync-period", "3s", "--udp-timeout", "3s",
			"--config-sync-period", "10m", "--kube-api-qps", "7", "--kube-api-burst", "20", "--cluster-cidr", "10.244.0.0/16",
			"--nodeport-addresses", "10.0.0.0/8", "--hostname-override", "Node-A", "--proxy-port-range", "30000-30099",
			"--bind-address-hard-fail", "--kube-api-content-type", "application/json"}, nil},
	} {
		file := filepath.Join(dir, strconv.Itoa(i)+".yaml")
		base := []string{"--manifests", dir}
		o := validatedOptions(t, slices.Concat(base, tc.own, tc.written))
		if err := o.writeConfig(file); err != nil {
			t.Fatal(err)
		}
		back := validatedOptions(t, slices.Concat(base, tc.own, []string{"--config", file}))
		want, got := o.effectiveConfig(), back.effectiveConfig()
		if !reflect.DeepEqual(got, want) {
			data, _ := os.ReadFile(file)
			wy, _ := yaml.Marshal(want)
			gy, _ := yaml.Marshal(got)
			t.Errorf("%q then --config %q: in force\n%s\nread back as\n%s\nfrom the file\n%s", tc.written, tc.own, wy, gy, data)
		}
	}
}

// validatedOptions is the options args give once validated, as runMain
// has them when it writes or runs.
func validatedOptions(t *testing.T, args []string) *options {
	t.Helper()
	o := parsedOptions(t, args)
	if _, err := o.validate(); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return o
}

// A --config that cannot be read is named once, by the flag's words, as
// --manifests is: "--config /x: /x: not a regular file (a directory)" and
// "--config missing: open missing: no such file or directory" said the
// path twice. The proxy and explain alike; the file's content errors
// were named once already.
func TestConfigFileReadErrorNamesThePathOnce(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("kind: Foo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ path, want string }{
		{dir, "--config " + dir + ": not a regular file (a directory)\n"},
		{missing, "--config " + missing + ": no such file or directory\n"},
		{bad, "--config " + bad + ": apiVersion/kind: want kubeproxy.config.k8s.io/v1alpha1, KubeProxyConfiguration"},
	}
	for _, tt := range tests {
		var code int
		stderr := capture(t, &os.Stderr, func() { code = runMain([]string{"--config", tt.path, "--iptables=false"}) })
		if code != exitUsage || !strings.Contains(stderr, "kube-userspace-proxy: "+tt.want) || strings.Count(stderr, tt.path) != 1 {
			t.Errorf("proxy: exit %d, stderr %q; want %d and %q, the path once", code, stderr, exitUsage, tt.want)
		}
		stderr = capture(t, &os.Stderr, func() { code = runExplain([]string{"--config", tt.path}) })
		if code != exitUsage || !strings.Contains(stderr, "kube-userspace-proxy explain: "+tt.want) || strings.Count(stderr, tt.path) != 1 {
			t.Errorf("explain: exit %d, stderr %q; want %d and %q, the path once", code, stderr, exitUsage, tt.want)
		}
	}
}

// The fields this proxy does not act on are checked as kube-proxy checks
// them (pkg/proxy/apis/config/validation), every error at once: a file
// kube-proxy refuses (iptables.masqueradeBit: 99) started here.
func TestConfigFileValidatedAsKubeProxy(t *testing.T) {
	const kubeadm = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection: {acceptContentTypes: "", burst: 0, contentType: "", kubeconfig: "", qps: 0}
clusterCIDR: ""
configSyncPeriod: 0s
conntrack: {maxPerCore: null, min: null, tcpBeLiberal: false, tcpCloseWaitTimeout: null, tcpEstablishedTimeout: null, udpStreamTimeout: 0s, udpTimeout: 0s}
detectLocal: {bridgeInterface: "", interfaceNamePrefix: ""}
detectLocalMode: ""
iptables: {localhostNodePorts: null, masqueradeAll: false, masqueradeBit: null, minSyncPeriod: 0s, syncPeriod: 0s}
ipvs: {excludeCIDRs: null, minSyncPeriod: 0s, scheduler: "", strictARP: false, syncPeriod: 0s, tcpFinTimeout: 0s, tcpTimeout: 0s, udpTimeout: 0s}
logging: {flushFrequency: 0, options: {json: {infoBufferSize: "0"}, text: {infoBufferSize: "0"}}, verbosity: 0}
mode: ""
nftables: {masqueradeAll: false, masqueradeBit: null, minSyncPeriod: 0s, syncPeriod: 0s}
oomScoreAdj: null
`
	for _, tc := range []struct {
		name, yaml string
		want       []string // each in the one error; none: taken
	}{
		{name: "kubeadm's default file", yaml: kubeadm},
		{name: "kube-proxy's defaults spelt out", yaml: configHead +
			"iptables: {masqueradeBit: 14}\noomScoreAdj: -999\nconntrack: {maxPerCore: 32768, min: 131072, tcpEstablishedTimeout: 24h, tcpCloseWaitTimeout: 1h}\n" +
			"detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\nlogging: {format: json, flushFrequency: 5s}\n"},
		{name: "the alpha logging options with their gate", yaml: configHead +
			"featureGates: {LoggingAlphaOptions: true, SomeKubeProxyGate: true}\nlogging: {options: {text: {splitStream: true}}}\n"},
		{name: "every field wrong", yaml: configHead +
			"iptables: {masqueradeBit: 99}\noomScoreAdj: 5000\nconntrack: {maxPerCore: -1, min: -1, tcpCloseWaitTimeout: -1s, udpTimeout: -2s}\n" +
			"detectLocalMode: Foo\nlogging: {format: xml, flushFrequency: -1s, options: {text: {splitStream: true}}}\n",
			want: []string{
				"iptables.masqueradeBit: Invalid value: 99: must be within the range [0, 31]",
				"oomScoreAdj: Invalid value: 5000: must be within the range [-1000, 1000]",
				"conntrack.maxPerCore: Invalid value: -1: must be greater than or equal to 0",
				"conntrack.min: Invalid value: -1: must be greater than or equal to 0",
				`conntrack.tcpCloseWaitTimeout: Invalid value: "-1s": must be greater than or equal to 0`,
				`conntrack.udpTimeout: Invalid value: "-2s": must be greater than or equal to 0`,
				`detectLocalMode: Unsupported value: "Foo"`,
				"logging.flushFrequency: Invalid value",
				`logging.format: Invalid value: "xml": Unsupported log format`,
				"logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled",
			}},
		{name: "a detect-local mode without its interface", yaml: configHead + "detectLocalMode: InterfaceNamePrefix\n",
			want: []string{`detectLocal.interfaceNamePrefix: Invalid value: "": must not be empty`}},
		{name: "vmodule in the json format", yaml: configHead + "logging: {format: json, vmodule: [{filePattern: proxier, verbosity: 4}]}\n",
			want: []string{"logging.vmodule: Forbidden: Only supported for text log format"}},
		{name: "the ipvs block in ipvs mode", yaml: configHead + "mode: ipvs\nipvs: {tcpTimeout: -1s, excludeCIDRs: [10.0.0.0/8, x]}\n",
			want: []string{`ipvs.tcpTimeout: Invalid value: "-1s"`, `ipvs.excludeCIDRs[1]: Invalid value: "x": must be a valid CIDR`}},
		{name: "the nftables block in nftables mode", yaml: configHead + "mode: nftables\nnftables: {masqueradeBit: 32}\n",
			want: []string{"nftables.masqueradeBit: Invalid value: 32"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.addFlags(fs)
			if err := o.applyConfigData([]byte(tc.yaml), fs); err != nil {
				t.Fatalf("not read: %v", err)
			}
			// validate reports them (TestConfigFileFieldErrorsWithTheOthers).
			errs := o.configFieldErrors
			if len(tc.want) == 0 {
				if len(errs) > 0 {
					t.Fatalf("refused: %q", errs)
				}
				return
			}
			if len(errs) == 0 {
				t.Fatalf("taken; want %q", tc.want)
			}
			for _, w := range tc.want {
				if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, w) }) {
					t.Errorf("errors %q\nlack %q", errs, w)
				}
			}
			for _, e := range errs {
				if strings.ContainsAny(e, "\n\r") {
					t.Errorf("error %q: want one line", e)
				}
			}
		})
	}
}

// A --config field kube-proxy's validation refuses is reported with every
// other error, of the file and of the command line: it was reported
// alone, the rest only once it was fixed and the proxy started again.
func TestConfigFileFieldErrorsWithTheOthers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(configHead+"bindAddress: foo\niptables: {masqueradeBit: 99}\nconntrack: {min: -1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--manifests", t.TempDir(), "--iptables=false", "--init-only", "--config", path, "--log-flush-frequency=-1s"}
	var code int
	stderr := capture(t, &os.Stderr, func() { code = runMain(args) })
	if code != exitUsage {
		t.Fatalf("runMain(%q) = %d, want %d; stderr %s", args, code, exitUsage, stderr)
	}
	for _, want := range []string{
		"--config " + path + ": iptables.masqueradeBit: Invalid value: 99: must be within the range [0, 31]",
		"--config " + path + ": conntrack.min: Invalid value: -1: must be greater than or equal to 0",
		`--bind-address "foo" is not an IP address (bindAddress in --config ` + path + ")",
		`--log-flush-frequency: Invalid value: "-1s": Must be greater than zero`,
	} {
		if !strings.Contains(stderr, "\n"+want+"\n") {
			t.Errorf("stderr lacks the line %q:\n%s", want, stderr)
		}
	}

	// The same content written while the proxy runs would not start: the
	// running configuration is kept (configwatch.go).
	err := configChecker(args[:len(args)-1])([]byte(configHead + "iptables: {masqueradeBit: 99}\n"))
	if err == nil || !strings.Contains(err.Error(), "iptables.masqueradeBit: Invalid value: 99") {
		t.Errorf("configChecker: %v, want the masqueradeBit refused", err)
	}
}
