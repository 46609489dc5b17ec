package main

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// kube-proxy's flags that a DaemonSet passes and a userspace proxy has no
// use for are accepted (they were "unknown flag", exit 2), named in one
// log line at start; a value kube-proxy could not parse is still exit 2.
func TestKubeProxyFlagsAccepted(t *testing.T) {
	given := []string{
		"--masquerade-all", "--conntrack-max-per-core=0", "--conntrack-min=131072",
		"--conntrack-tcp-timeout-established=24h", "--conntrack-tcp-timeout-close-wait=1h",
		"--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=30s", "--conntrack-udp-timeout-stream=2m",
		"--oom-score-adj=-999", "--feature-gates=AllAlpha=false,SomeGate=true,LoggingAlphaOptions=true", "--profiling=false",
		"--detect-local-mode=NodeCIDR", "--pod-bridge-interface=cbr0", "--pod-interface-name-prefix=veth",
		"--show-hidden-metrics-for-version=1.36", "--iptables-masquerade-bit=14", "--iptables-localhost-nodeports=false",
		"--ipvs-scheduler=rr", "--ipvs-sync-period=30s", "--ipvs-min-sync-period=1s", "--ipvs-exclude-cidrs=10.0.0.0/8",
		"--ipvs-strict-arp", "--ipvs-tcp-timeout=0s", "--ipvs-tcpfin-timeout=0s", "--ipvs-udp-timeout=0s",
		// component-base's logging flags, which kube-proxy registers: a
		// sweep pasting a DaemonSet's --logging-format=json got exit 2.
		// The split streams and buffer sizes need the LoggingAlphaOptions
		// gate, in kube-proxy's validation and here.
		"--logging-format=json", "--log-flush-frequency=5s", "--log-text-info-buffer-size=64Ki",
		"--log-text-split-stream", "--log-json-info-buffer-size=1M", "--log-json-split-stream",
	}
	logs := captureKlog(t)
	args := append([]string{"--manifests", t.TempDir(), "--iptables=false", "--init-only"}, given...)
	var code int
	stderr := capture(t, &os.Stderr, func() { code = runMain(args) })
	if code != 0 {
		t.Fatalf("runMain(%q) = %d, want 0; stderr %s", args, code, stderr)
	}
	klog.Flush()
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "Ignoring flags this proxy does not act on") {
			if line != "" {
				t.Errorf("more than one line names the ignored flags:\n%s\n%s", line, l)
			}
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no log line names the ignored flags; log:\n%s", logs)
	}
	for _, a := range given {
		name, _, _ := strings.Cut(a, "=")
		if !strings.Contains(line, `"`+name+`"`) {
			t.Errorf("the log line does not name %s: %s", name, line)
		}
	}

	// ClusterCIDR is what --cluster-cidr does here: not ignored.
	o := newOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse([]string{"--manifests", t.TempDir(), "--detect-local-mode=ClusterCIDR"}); err != nil {
		t.Fatal(err)
	}
	if _, err := o.validate(); err != nil {
		t.Fatal(err)
	}
	if flags := ignoredFlagsGiven(fs); len(flags) > 0 {
		t.Errorf("--detect-local-mode=ClusterCIDR named as ignored: %v", flags)
	}

	for _, bad := range [][]string{
		{"--conntrack-min=many"}, {"--masquerade-all=maybe"}, {"--oom-score-adj=1.5"},
		{"--feature-gates=SomeGate=yes-please"}, {"--conntrack-udp-timeout=30"},
		{"--detect-local-mode=Bogus"}, {"--healthz-port=70000"},
		// component-base's buffer sizes are quantities (512, 1K, 2Ki):
		// they were plain strings here, so any text passed.
		{"--log-text-info-buffer-size=lots"}, {"--log-json-info-buffer-size=1 MB"},
	} {
		if code := runMain(append([]string{"--manifests", t.TempDir(), "--init-only"}, bad...)); code != exitUsage {
			t.Errorf("runMain(%q) = %d, want %d", bad, code, exitUsage)
		}
	}
}

// --help lists the accepted kube-proxy flags apart from this proxy's own,
// and hides the deprecated ports, as kube-proxy's --help does.
func TestHelpListsKubeProxyFlagsApart(t *testing.T) {
	out := captureStdout(t, func() { runMain([]string{"--help"}) })
	own, ignored, ok := strings.Cut(out, "kube-proxy flags accepted and not acted on")
	if !ok {
		t.Fatalf("--help has no section for kube-proxy's ignored flags:\n%s", out)
	}
	listed := func(usage, flag string) bool {
		return strings.Contains(usage, "      "+flag+" ") || strings.Contains(usage, "      "+flag+"[")
	}
	for _, f := range []string{"--masquerade-all", "--conntrack-max-per-core", "--feature-gates", "--ipvs-scheduler"} {
		if !listed(ignored, f) || listed(own, f) {
			t.Errorf("%s is not in the ignored section alone", f)
		}
	}
	for _, f := range []string{"--init-only", "--cluster-cidr", "--manifests"} {
		if !listed(own, f) || listed(ignored, f) {
			t.Errorf("%s is not among this proxy's own flags alone", f)
		}
	}
	if strings.Contains(out, "--healthz-port") || strings.Contains(out, "--metrics-port") {
		t.Errorf("--help lists the deprecated ports")
	}
}

// kube-proxy's deprecated --healthz-port and --metrics-port are honoured as
// kube-proxy's addressFromDeprecatedFlags: 0 disables the server (a
// DaemonSet relying on it would otherwise serve on a port it meant to
// leave free), another port is that of a bind address given without one.
func TestDeprecatedServerPorts(t *testing.T) {
	for _, tt := range []struct {
		args                  []string
		wantHealth, wantMetrs string
	}{
		{[]string{"--healthz-port=0"}, "", "127.0.0.1:10249"},
		{[]string{"--metrics-port=0"}, "0.0.0.0:10256", ""},
		{[]string{"--metrics-port=9100", "--metrics-bind-address=0.0.0.0"}, "0.0.0.0:10256", "0.0.0.0:9100"},
		{[]string{"--healthz-port=9101"}, "0.0.0.0:10256", "127.0.0.1:10249"}, // the default has a port, as in kube-proxy
	} {
		o := parsedOptions(t, append([]string{"--manifests", t.TempDir()}, tt.args...))
		if _, err := o.validate(); err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		if o.healthzBindAddress != tt.wantHealth || o.metricsBindAddress != tt.wantMetrs {
			t.Errorf("%q: health %q, metrics %q; want %q, %q", tt.args, o.healthzBindAddress, o.metricsBindAddress, tt.wantHealth, tt.wantMetrs)
		}
	}
}

// --logging-format takes kube-proxy's formats: text (what this proxy
// writes, so not "ignored") and json (accepted, not acted on); another is
// exit 2, as kube-proxy's validation refuses it.
func TestLoggingFormatValues(t *testing.T) {
	for _, tc := range []struct {
		format  string
		code    int
		ignored bool
	}{{"text", 0, false}, {"json", 0, true}, {"xml", 2, false}} {
		logs := captureKlog(t)
		args := []string{"--manifests", t.TempDir(), "--iptables=false", "--init-only", "--logging-format=" + tc.format}
		var code int
		stderr := capture(t, &os.Stderr, func() { code = runMain(args) })
		klog.Flush()
		if code != tc.code {
			t.Errorf("--logging-format=%s: exit %d, want %d; stderr %s", tc.format, code, tc.code, stderr)
		}
		if got := strings.Contains(logs.String(), `"--logging-format"`); got != tc.ignored {
			t.Errorf("--logging-format=%s: named as ignored %v, want %v", tc.format, got, tc.ignored)
		}
	}
}

// The values of kube-proxy's flags are checked as kube-proxy checks the
// configuration they write (pkg/proxy/apis/config/validation), every
// error at once, each naming its flag: --iptables-masquerade-bit=99
// started.
func TestKubeProxyFlagValuesValidated(t *testing.T) {
	args := []string{"--manifests", t.TempDir(), "--iptables=false", "--init-only",
		"--iptables-masquerade-bit=99", "--oom-score-adj=-1001", "--conntrack-max-per-core=-1", "--conntrack-min=-1",
		"--conntrack-tcp-timeout-established=-1s", "--conntrack-tcp-timeout-close-wait=-1s",
		"--conntrack-udp-timeout=-1s", "--conntrack-udp-timeout-stream=-1s",
		"--detect-local-mode=BridgeInterface", "--log-flush-frequency=-1s", "--log-json-split-stream"}
	var code int
	stderr := capture(t, &os.Stderr, func() { code = runMain(args) })
	if code != exitUsage {
		t.Fatalf("runMain(%q) = %d, want %d; stderr %s", args, code, exitUsage, stderr)
	}
	for _, want := range []string{
		"--iptables-masquerade-bit: Invalid value: 99: must be within the range [0, 31]",
		"--oom-score-adj: Invalid value: -1001: must be within the range [-1000, 1000]",
		"--conntrack-max-per-core: Invalid value: -1: must be greater than or equal to 0",
		"--conntrack-min: Invalid value: -1: must be greater than or equal to 0",
		`--conntrack-tcp-timeout-established: Invalid value: "-1s": must be greater than or equal to 0`,
		`--conntrack-tcp-timeout-close-wait: Invalid value: "-1s"`,
		`--conntrack-udp-timeout: Invalid value: "-1s"`,
		`--conntrack-udp-timeout-stream: Invalid value: "-1s"`,
		`--pod-bridge-interface: Invalid value: "": must not be empty`,
		`--log-flush-frequency: Invalid value: "-1s": Must be greater than zero`,
		"--log-json-split-stream: Forbidden: Feature LoggingAlphaOptions is disabled",
	} {
		if !strings.Contains(stderr, "\n"+want) {
			t.Errorf("stderr lacks the line %q:\n%s", want, stderr)
		}
	}

	// The ipvs flags only in ipvs mode, as kube-proxy, which this proxy
	// refuses in the same message.
	args = []string{"--manifests", t.TempDir(), "--iptables=false", "--init-only", "--ipvs-exclude-cidrs=10.0.0.0/8,x", "--ipvs-tcp-timeout=-1s"}
	if code := runMain(args); code != 0 {
		t.Errorf("runMain(%q) = %d, want 0: the ipvs flags are not checked outside ipvs mode", args, code)
	}
	stderr = capture(t, &os.Stderr, func() { code = runMain(append(args, "--proxy-mode=ipvs")) })
	for _, want := range []string{`--proxy-mode "ipvs" is not supported`, `--ipvs-exclude-cidrs: Invalid value: "x": must be a valid CIDR`, `--ipvs-tcp-timeout: Invalid value: "-1s"`} {
		if code != exitUsage || !strings.Contains(stderr, want) {
			t.Errorf("--proxy-mode=ipvs: exit %d, stderr lacks %q:\n%s", code, want, stderr)
		}
	}
}

// Beside --config, kube-proxy discards its flags but the logging ones and
// takes the file's featureGates (cmd/kube-proxy/app Complete replaces the
// flags' configuration with the file's), so it never checks a stale
// --iptables-masquerade-bit, and --log-text-split-stream is allowed by the
// file's LoggingAlphaOptions: both command lines start kube-proxy, and
// were refused here (exit 2).
func TestKubeProxyFlagValuesBesideConfig(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		path := dir + "/" + name
		if err := os.WriteFile(path, []byte(configHead+body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	gated := file("gated.yaml", "featureGates: {LoggingAlphaOptions: true}\n")
	plain := file("plain.yaml", "")
	jsonVModule := file("json-vmodule.yaml", "logging: {format: json, vmodule: [{filePattern: proxier, verbosity: 4}]}\n")
	badFlush := file("bad-flush.yaml", "logging: {flushFrequency: -1s}\n")
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr, exit 2; "": starts
	}{
		{"stale flags kube-proxy discards", []string{"--config", plain, "--iptables-masquerade-bit=32", "--conntrack-min=-1", "--oom-score-adj=5000", "--detect-local-mode=Foo"}, ""},
		{"an alpha logging flag the file's gate allows", []string{"--config", gated, "--log-text-split-stream"}, ""},
		// This proxy's rule, flags win: the flag's gate allows it too
		// (kube-proxy would take the file's gates and refuse it).
		{"an alpha logging flag the flag's gate allows", []string{"--config", plain, "--feature-gates=LoggingAlphaOptions=true", "--log-text-split-stream"}, ""},
		// The logging flags are kept beside --config: checked still.
		{"an alpha logging flag no gate allows", []string{"--config", plain, "--log-text-split-stream"},
			"--log-text-split-stream: Forbidden: Feature LoggingAlphaOptions is disabled"},
		{"a logging flag's bad value", []string{"--config", plain, "--log-flush-frequency=-1s"},
			`--log-flush-frequency: Invalid value: "-1s": Must be greater than zero`},
		// kube-proxy validates the file's logging with the logging flags
		// given over it (copyLogsFromFlags): text beside the file's
		// vmodule, and a flush frequency the flag replaces, start it.
		{"the file's json and vmodule, --logging-format=text", []string{"--config", jsonVModule, "--logging-format=text"}, ""},
		{"the file's bad flush frequency, a flag's good one", []string{"--config", badFlush, "--log-flush-frequency=2s"}, ""},
		{"the file's json and vmodule alone", []string{"--config", jsonVModule}, "logging.vmodule: Forbidden: Only supported for text log format"},
		{"the file's bad flush frequency alone", []string{"--config", badFlush}, "logging.flushFrequency: Invalid value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--manifests", t.TempDir(), "--iptables=false", "--init-only"}, tc.args...)
			var code int
			stderr := capture(t, &os.Stderr, func() { code = runMain(args) })
			switch {
			case tc.want == "" && code != 0:
				t.Errorf("runMain(%q) = %d, want 0; stderr %s", args, code, stderr)
			case tc.want != "" && (code != exitUsage || !strings.Contains(stderr, tc.want)):
				t.Errorf("runMain(%q) = %d, want %d and %q; stderr %s", args, code, exitUsage, tc.want, stderr)
			}
		})
	}
}

// --vmodule is for the text format only, as kube-proxy checks it with the
// logging flags over its file's logging (copyLogsFromFlags): beside
// logging.format json in --config, or --logging-format=json, kube-proxy
// refuses it, and this proxy started.
func TestVModuleFlagOnlyWithText(t *testing.T) {
	jsonOnly := t.TempDir() + "/json.yaml"
	if err := os.WriteFile(jsonOnly, []byte(configHead+"logging: {format: json}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // klog's -vmodule is global: runMain's parse set it
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("vmodule", "")
	})
	jsonVModule := t.TempDir() + "/json-vmodule.yaml"
	if err := os.WriteFile(jsonVModule, []byte(configHead+"logging: {format: json, vmodule: [{filePattern: proxier, verbosity: 4}]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const refused = "--vmodule: Forbidden: Only supported for text log format"
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr, exit 2; "": starts
	}{
		{"the file's json", []string{"--config", jsonOnly, "--vmodule=proxier=4"}, refused},
		{"--logging-format=json", []string{"--logging-format=json", "--vmodule=proxier=4"}, refused},
		{"the file's json, --logging-format=text", []string{"--config", jsonOnly, "--logging-format=text", "--vmodule=proxier=4"}, ""},
		{"text", []string{"--vmodule=proxier=4"}, ""},
		// The file's own vmodule is the file's error, said once: the
		// --vmodule it sets is not one given.
		{"the file's json and vmodule", []string{"--config", jsonVModule}, "logging.vmodule: Forbidden: Only supported for text log format\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--manifests", t.TempDir(), "--iptables=false", "--init-only"}, tc.args...)
			var code int
			stderr := capture(t, &os.Stderr, func() { code = runMain(args) })
			switch {
			case tc.want == "" && code != 0:
				t.Errorf("runMain(%q) = %d, want 0; stderr %s", args, code, stderr)
			case tc.want != "" && (code != exitUsage || !strings.Contains(stderr, tc.want)):
				t.Errorf("runMain(%q) = %d, want %d and %q; stderr %s", args, code, exitUsage, tc.want, stderr)
			case strings.Count(stderr, "Only supported for text log format") > 1:
				t.Errorf("runMain(%q): said more than once; stderr %s", args, stderr)
			}
		})
	}
}
