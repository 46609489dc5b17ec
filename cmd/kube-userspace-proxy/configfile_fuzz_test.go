package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

const configHead = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// configWhere is how every --config error starts: where the problem is.
// An unknown or duplicate field is quoted (its name may be any string).
var configWhere = regexp.MustCompile(`^(?:(?:line \d+|document|apiVersion/kind|(?:[A-Za-z][A-Za-z0-9]*|\["(?:[^"\\]|\\.)*"\])(?:\.[A-Za-z][A-Za-z0-9]*|\["(?:[^"\\]|\\.)*"\])*): \S|(?:unknown|duplicate) field ")`)

// FuzzConfigFile: no --config content panics the loader; a file it refuses
// gets a one-line error that starts with where the problem is (a line, a
// field path, or apiVersion/kind); a file it takes reads back the same after
// being written out again, and when validation refuses an option the file
// set, the message names the file's field as well as the flag.
func FuzzConfigFile(f *testing.F) {
	for _, seed := range []string{
		configHead + `mode: userspace
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
`,
		configHead + "iptables: {syncPeriod: abc}\n",
		configHead + "iptables: {syncPeriod: 20}\n",
		configHead + "iptables: {syncPeriod: -5s, minSyncPeriod: 1m}\n",
		configHead + "udpIdleTimeout: x\n",
		configHead + "configSyncPeriod: [1]\n",
		configHead + "mode: iptables\n",
		configHead + "bindAddress: nope\nportRange: 5-1\n",
		configHead + "nodePortAddresses: [1, x]\n",
		configHead + "bogus: 1\n",
		configHead + "mode: a\nmode: b\n",
		configHead + "a: b: c\n",
		configHead + "logging: {verbosity: 4}\n---\n# end\n---\nkind: Service\n",
		"apiVersion: v1\nkind: ConfigMap\n",
		`{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","iptables":{"syncPeriod":"1s"}}`,
		"- 1\n",
		"\t",
		"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := decodeConfigFile(data)
		if err != nil {
			msg := err.Error()
			if !configWhere.MatchString(msg) || strings.ContainsAny(msg, "\n\r") {
				t.Fatalf("error does not start with where the problem is, on one line: %q", msg)
			}
			return
		}
		if cfg.APIVersion != configAPIVersion || cfg.Kind != "KubeProxyConfiguration" {
			t.Fatalf("took %q %q", cfg.APIVersion, cfg.Kind)
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeConfigFile(out)
		if err != nil || !equality.Semantic.DeepEqual(cfg, again) {
			t.Fatalf("written out and read again: %v\n%s", err, out)
		}

		o := newOptions()
		o.configFile = "proxy.yaml"
		o.applyConfig(cfg, pflag.NewFlagSet("fuzz", pflag.ContinueOnError))
		if o.kubeconfig == "" {
			o.manifests = "manifests"
		}
		_, err = o.validate()
		if err == nil {
			return
		}
		for _, line := range strings.Split(err.Error(), "\n") {
			for flag, field := range o.fileFields {
				if mentionsFlag(line, flag) && !strings.Contains(line, field) {
					t.Fatalf("%q blames --%s, not the file's %s", line, flag, field)
				}
			}
		}
	})
}
