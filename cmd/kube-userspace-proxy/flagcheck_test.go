package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// A missing --manifests path and a bind address that could never listen are
// refused at flag-check time, naming the flag, with exit 2 (they were found
// once the proxy ran and exited 1). Only flag sets that fail validation are
// handed to runMain: nothing starts.
func TestFlagCheckRefusesAtStart(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	config := filepath.Join(dir, "proxy.yaml")
	if err := os.WriteFile(config, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhealthzBindAddress: 0.0.0.0:10256000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args    []string
		wantErr string // "" = valid
	}{
		{[]string{"--manifests", missing}, `--manifests "` + missing + `": no such file or directory`},
		{[]string{"--manifests", missing, "--cleanup"}, ""}, // cleanup reads no source
		{[]string{"--healthz-bind-address", ":99999"}, `--healthz-bind-address ":99999": port "99999" is not a number 0-65535`},
		{[]string{"--metrics-bind-address", "host:abc"}, `--metrics-bind-address "host:abc": port "abc" is not a number 0-65535`},
		{[]string{"--metrics-bind-address", "127.0.0.1:-1"}, `port "-1" is not a number`},
		{[]string{"--fault-api-bind-address", "127.0.0.1:"}, `--fault-api-bind-address "127.0.0.1:": port "" is not a number`},
		{[]string{"--metrics-bind-address", "localhost"}, `--metrics-bind-address "localhost": want HOST:PORT`},
		{[]string{"--healthz-bind-address", "no host:10256"}, `host "no host" is neither an IP address nor a host name`},
		{[]string{"--config", config}, `--healthz-bind-address "0.0.0.0:10256000": port "10256000" is not a number 0-65535 (healthzBindAddress in --config ` + config + `)`},
		{[]string{"--healthz-bind-address", "localhost:10256"}, ""},
		{[]string{"--healthz-bind-address", "[::1]:0"}, ""},
		{[]string{"--metrics-bind-address", ":10249"}, ""},
		{[]string{"--fault-api-bind-address", "Node-1.example:8474"}, ""},
	}
	base := []string{"--iptables=false", "--bind-address", "127.0.0.1", "--manifests", dir}
	for _, tt := range tests {
		args := append(append([]string(nil), base...), tt.args...)
		err := checkValidate(t, fmt.Sprintf("%q", tt.args), args, tt.wantErr)
		if tt.wantErr != "" && err != nil { // a flag set that validates would run the proxy
			var code int
			stderr := capture(t, &os.Stderr, func() { code = runMain(args) })
			if code != exitUsage || !strings.Contains(stderr, tt.wantErr) {
				t.Errorf("runMain(%q) = %d, stderr %q; want %d and the message", tt.args, code, stderr, exitUsage)
			}
		}
	}
}

// TestBindAddressWithoutPort: an IP alone in --healthz-bind-address or
// --metrics-bind-address (flag or --config) gets the server's default port,
// as kube-proxy appends it; it was refused with "want HOST:PORT".
func TestBindAddressWithoutPort(t *testing.T) {
	for _, tt := range []struct {
		args                 []string
		wantHealth, wantMetr string
	}{
		{nil, "0.0.0.0:10256", "127.0.0.1:10249"},
		{[]string{"--healthz-bind-address", "0.0.0.0"}, "0.0.0.0:10256", "127.0.0.1:10249"},
		{[]string{"--healthz-bind-address", "::"}, "[::]:10256", "127.0.0.1:10249"},
		{[]string{"--metrics-bind-address", "127.0.0.2"}, "0.0.0.0:10256", "127.0.0.2:10249"},
		{[]string{"--metrics-bind-address", "127.0.0.2:9999"}, "0.0.0.0:10256", "127.0.0.2:9999"},
		{[]string{"--healthz-bind-address", ""}, "", "127.0.0.1:10249"},
	} {
		o := parsedOptions(t, append([]string{"--iptables=false", "--manifests", t.TempDir()}, tt.args...))
		if _, err := o.validate(); err != nil {
			t.Errorf("%q: refused: %v", tt.args, err)
			continue
		}
		if o.healthzBindAddress != tt.wantHealth || o.metricsBindAddress != tt.wantMetr {
			t.Errorf("%q: healthz %q, metrics %q; want %q, %q", tt.args, o.healthzBindAddress, o.metricsBindAddress, tt.wantHealth, tt.wantMetr)
		}
	}
}

// parsedOptions is the options args give, --config applied, not yet
// validated.
// checkValidate validates args' options and reports, under label, an
// error where wantErr is empty, or one that does not contain wantErr.
func checkValidate(t *testing.T, label string, args []string, wantErr string) error {
	t.Helper()
	_, err := parsedOptions(t, args).validate()
	switch {
	case wantErr == "" && err != nil:
		t.Errorf("%s: refused: %v", label, err)
	case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
		t.Errorf("%s: error %v, want one containing %q", label, err, wantErr)
	}
	return err
}

func parsedOptions(t *testing.T, args []string) *options {
	t.Helper()
	o := newOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	if o.configFile != "" {
		if err := o.applyConfigFile(fs); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
	}
	o.noteGivenFlags(fs) // as runMain
	return o
}

// Every flag's --help line names its value by its type (or a word the
// usage chose on purpose): pflag takes backquoted text in a usage as the
// value's name, and --node-ip showed as "--node-ip ip route get".
func TestHelpValueNamesAreOneWord(t *testing.T) {
	fs := pflag.NewFlagSet("help", pflag.ContinueOnError)
	newOptions().addFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if name, _ := pflag.UnquoteUsage(f); strings.ContainsAny(name, " \t") {
			t.Errorf("--%s shows its value as %q in --help", f.Name, name)
		}
	})
}

// kube-proxy runs through component-base's cli.Run, whose
// WordSepNormalizeFunc reads "_" in a flag's name as "-": --hostname_override
// and --bind_address work there, and older kube-proxy command lines carry
// them. They were unknown flags here (exit 2). Every parse of the flags
// (the start, the --config change check, explain) takes them.
func TestUnderscoreFlagNamesAsKubeProxy(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.conf")
	if err := os.WriteFile(cfg, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--manifests", dir, "--config", cfg, "--iptables=false", "--bind_address=127.0.0.1", "--hostname_override=Node_1",
		"--iptables_min_sync_period=2s", "--kube_api_qps=7", "--healthz_bind_address=", "--metrics_bind_address="}
	o := parsedOptions(t, args)
	if o.bindAddress != "127.0.0.1" || o.hostnameOverride != "Node_1" || o.kubeAPIQPS != 7 || o.healthzBindAddress != "" || !o.minSyncPeriodGiven {
		t.Errorf("underscore flags not applied: bind %q hostname %q qps %v healthz %q min sync given %v", o.bindAddress, o.hostnameOverride, o.kubeAPIQPS, o.healthzBindAddress, o.minSyncPeriodGiven)
	}
	if code := runMain(append(slices.Clone(args), "--init-only")); code != 0 {
		t.Errorf("runMain(%q) = %d, want 0", args, code)
	}
	if err := configChecker(args)([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nudpIdleTimeout: 1s\n")); err != nil {
		t.Errorf("the --config change check refuses a valid change: %v", err)
	}
	var out strings.Builder
	if code := explain(context.Background(), []string{"--manifests", dir, "--node_ip", "192.0.2.1"}, &out); code != 0 {
		t.Errorf("explain --node_ip = %d, want 0", code)
	}
}
