package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// captureStdout runs f with os.Stdout redirected and returns what it wrote.
func captureStdout(t *testing.T, f func()) string { return capture(t, &os.Stdout, f) }

// capture runs f with *file redirected to a pipe and returns what it wrote.
func capture(t *testing.T, file **os.File, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := *file
	*file = w
	defer func() { *file = saved }()
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	f()
	w.Close()
	return <-done
}

// kube-proxy's conventions: help and version are output (stdout, exit 0),
// and the fault flags of the contract exist.
func TestHelpAndVersionOnStdout(t *testing.T) {
	var code int
	out := captureStdout(t, func() { code = runMain([]string{"--help"}) })
	if code != 0 || !strings.Contains(out, "Usage: kube-userspace-proxy") {
		t.Fatalf("--help: exit %d, stdout %q", code, out)
	}
	for _, flag := range []string{"--fault-api-bind-address", "--fault-seed", "--fault-max-active", "--manifests", "--proxy-port-range"} {
		if !strings.Contains(out, flag) {
			t.Errorf("--help does not list %s", flag)
		}
	}
	out = captureStdout(t, func() { code = runMain([]string{"--version"}) })
	if code != 0 || !strings.HasPrefix(out, "kube-userspace-proxy ") {
		t.Fatalf("--version: exit %d, stdout %q", code, out)
	}
	// The subcommands' help too (demo's went to stderr).
	for sub, run := range map[string]func() int{
		"demo":    func() int { return runDemo([]string{"--help"}) },
		"explain": func() int { return explain(t.Context(), []string{"--help"}, io.Discard) },
	} {
		out = captureStdout(t, func() { code = run() })
		if code != 0 || !strings.Contains(out, "Usage: kube-userspace-proxy "+sub) {
			t.Errorf("%s --help: exit %d, stdout %q", sub, code, out)
		}
	}
}

// kube-proxy's --version is component-base's verflag: `--version` and
// `--version=true` print the version line, `--version=raw` the version
// information as a Go value (version.Info), both on stdout with exit 0;
// `--version=raw` was refused here as not a boolean (exit 2).
func TestVersionRawAsKubeProxy(t *testing.T) {
	var code int
	out := captureStdout(t, func() { code = runMain([]string{"--version=raw"}) })
	if code != 0 || !strings.HasPrefix(out, "version.Info{") || !strings.Contains(out, `GoVersion:"go`) || !strings.Contains(out, `Platform:"`+runtime.GOOS+"/"+runtime.GOARCH+`"`) {
		t.Errorf("--version=raw: exit %d, stdout %q, want exit 0 and a version.Info", code, out)
	}
	// Major and Minor from a semantic version, as kube-proxy's.
	defer func(v string) { version = v }(version)
	version = "v1.37.2"
	if info := rawVersion(); info.Major != "1" || info.Minor != "37" || info.GitVersion != "v1.37.2" {
		t.Errorf("--version=raw of v1.37.2: %#v, want Major 1 and Minor 37", info)
	}
	version = "(devel)"
	if info := rawVersion(); info.Major != "" || info.Minor != "" {
		t.Errorf("--version=raw of (devel): %#v, want no Major or Minor", info)
	}
	out = captureStdout(t, func() { code = runMain([]string{"--version=true"}) })
	if code != 0 || !strings.HasPrefix(out, "kube-userspace-proxy ") {
		t.Errorf("--version=true: exit %d, stdout %q", code, out)
	}
	if code := runMain([]string{"--version=maybe"}); code != exitUsage {
		t.Errorf("--version=maybe: exit %d, want %d", code, exitUsage)
	}
	// --version=false prints nothing and goes on, as kube-proxy's: here to
	// the stray argument's exit 2.
	out = captureStdout(t, func() { code = runMain([]string{"--version=false", "x"}) })
	if code != exitUsage || out != "" {
		t.Errorf("--version=false x: exit %d, stdout %q; want exit %d and nothing printed", code, out, exitUsage)
	}
}

func TestBadFaultFlagsExitTwo(t *testing.T) {
	for _, args := range [][]string{
		{"--fault-api-bind-address", "8474"},
		{"--fault-max-active", "-1"},
		{"--fault-max-buffered-bytes", "-1"},
		{"--fault-seed", "x"},
	} {
		if code := runMain(args); code != exitUsage {
			t.Errorf("runMain(%q) = %d, want %d", args, code, exitUsage)
		}
	}
}

// A --fault-seed that is an integer out of int64's range says so; pflag's
// own message was "must be an integer".
func TestFaultSeedOutOfRange(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"9223372036854775808", `invalid argument "9223372036854775808" for "--fault-seed" flag: out of range: from -9223372036854775808 to 9223372036854775807`},
		{"x", `invalid argument "x" for "--fault-seed" flag: must be an integer`},
	} {
		var code int
		stderr := capture(t, &os.Stderr, func() { code = runMain([]string{"--fault-seed", tc.value}) })
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("--fault-seed %s: exit %d, stderr %q; want %d and %q", tc.value, code, stderr, exitUsage, tc.want)
		}
	}
}

// --cleanup without the privilege iptables needs says so and exits 1,
// before any iptables command (which printed their own permission errors,
// one per chain and family).
func TestCleanupWithoutNetAdmin(t *testing.T) {
	saved := canProgramIptables
	canProgramIptables = func() bool { return false }
	defer func() { canProgramIptables = saved }()
	savedCleanup := cleanupRules
	cleanupRules = func() error { t.Error("cleanup ran iptables without the privilege"); return nil }
	defer func() { cleanupRules = savedCleanup }()
	var code int
	stderr := capture(t, &os.Stderr, func() { code = runMain([]string{"--cleanup"}) })
	if code != 1 || !strings.Contains(stderr, "needs root or CAP_NET_ADMIN") {
		t.Fatalf("exit %d, stderr %q; want 1 and what is missing", code, stderr)
	}
}

// Without the privilege iptables needs, the default --iptables=true fails
// at start with a message saying what to do, and exit 1.
func TestNoNetAdminFailsAtStart(t *testing.T) {
	saved := canProgramIptables
	canProgramIptables = func() bool { return false }
	defer func() { canProgramIptables = saved }()
	dir := t.TempDir()
	var code int
	stderr := capture(t, &os.Stderr, func() {
		code = runMain([]string{"--manifests", dir, "--healthz-bind-address", "", "--metrics-bind-address", ""})
	})
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(stderr, "CAP_NET_ADMIN") || !strings.Contains(stderr, "--iptables=false") {
		t.Fatalf("stderr %q does not say what is missing and how to run without iptables", stderr)
	}
}

// --bind-address's help says what 0.0.0.0 does here: it takes both
// families (a service port with IPv6 addresses gets a dual-stack socket),
// where the help said "0.0.0.0 for all IPv4 interfaces".
func TestBindAddressHelpSaysBothFamilies(t *testing.T) {
	out := captureStdout(t, func() { runMain([]string{"--help"}) })
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "      --bind-address ") {
			line = l
		}
	}
	if strings.Contains(line, "IPv4 interfaces") || !strings.Contains(line, "dual-stack") {
		t.Errorf("--help's --bind-address line does not say 0.0.0.0 takes both families: %q", line)
	}
}

// The commit is said once: a pseudo-version carries it already.
func TestVersionOf(t *testing.T) {
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "c1dcfee27d96aaaabbbbccccddddeeeeffff0000"}
	for _, tc := range []struct {
		name, main, linked, want string
	}{
		{"pseudo-version", "v0.0.0-20261204211734-c1dcfee27d96", "", "v0.0.0-20261204211734-c1dcfee27d96 go1.26.8"},
		{"devel build", "(devel)", "", "(devel) c1dcfee27d96 go1.26.8"},
		{"link-time version", "(devel)", "v1.2.3", "v1.2.3 go1.26.8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: tc.main}, Settings: []debug.BuildSetting{rev}}
			if got := versionOf(bi, tc.linked); got != tc.want {
				t.Errorf("versionOf = %q, want %q", got, tc.want)
			}
		})
	}
}

// A misspelt flag gets the one it probably meant.
func TestMisspeltFlagSuggested(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"--bind-adress=1.2.3.4", "unknown flag: --bind-adress (did you mean --bind-address?)"},
		{"--nodeport-adresses", "(did you mean --nodeport-addresses?)"},
		{"--no-such-flag", "unknown flag: --no-such-flag\n"},
		// klog's flags of a kube-proxy command line from before 1.26,
		// when the userspace mode still was kube-proxy's: "unknown flag:
		// --logtostderr" alone sent the user to look up why.
		{"--logtostderr", "unknown flag: --logtostderr (klog's flag, which Kubernetes 1.26 removed from kube-proxy and its other components: the log goes to stderr; drop the flag, and redirect stderr to keep a file)"},
		{"--log_file=/var/log/kube-proxy.log", "unknown flag: --log_file (klog's flag, which Kubernetes 1.26 removed"},
		{"--alsologtostderr=true", "(klog's flag, which Kubernetes 1.26 removed"},
	} {
		var code int
		out := capture(t, &os.Stderr, func() { code = runMain([]string{tc.arg}) })
		if code != exitUsage || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", tc.arg, code, out, exitUsage, tc.want)
		}
	}
}

// explain suggests among its own flags too, the proxy flags it accepts
// and hides from its help included.
func TestExplainMisspeltFlagSuggested(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"--manifest", "(did you mean --manifests?)"},
		{"--udp-timout", "(did you mean --udp-timeout?)"},
	} {
		var code int
		out := capture(t, &os.Stderr, func() { code = explain(t.Context(), []string{tc.arg, "x"}, io.Discard) })
		if code != exitUsage || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, stderr %q", tc.arg, code, out)
		}
	}
}

// demo suggests among its flags too: `demo --serv` said only "unknown
// flag: --serv".
func TestDemoMisspeltFlagSuggested(t *testing.T) {
	var code int
	out := capture(t, &os.Stderr, func() { code = runDemo([]string{"--serv"}) })
	if want := "unknown flag: --serv (did you mean --serve?)"; code != exitUsage || !strings.Contains(out, want) {
		t.Errorf("exit %d, stderr %q; want %d and %q", code, out, exitUsage, want)
	}
}

// --cleanup given with --init-only still cleans up, as kube-proxy's Run
// does cleanup first (review: --init-only exited 0 without it).
func TestCleanupBeforeInitOnly(t *testing.T) {
	savedCan, savedCleanup := canProgramIptables, cleanupRules
	defer func() { canProgramIptables, cleanupRules = savedCan, savedCleanup }()
	ran := false
	canProgramIptables = func() bool { return true }
	cleanupRules = func() error { ran = true; return nil }
	if code := runMain([]string{"--cleanup", "--init-only"}); code != 0 || !ran {
		t.Errorf("exit %d, cleanup ran %v; want 0 and a cleanup", code, ran)
	}
}

// A manifests path given without its flag (`explain examples/manifests`,
// as `kubectl apply -f` and most tools read a path) is named with the flag
// it wants: "unexpected arguments" alone left the newcomer to guess.
func TestManifestsPathWithoutFlagExplained(t *testing.T) {
	dir := t.TempDir()
	want := fmt.Sprintf(`unexpected arguments [%q]: a path of manifests goes after --manifests: --manifests %s`, dir, dir)
	var code int
	out := capture(t, &os.Stderr, func() { code = runMain([]string{"--iptables=false", dir}) })
	if code != exitUsage || !strings.Contains(out, want) {
		t.Errorf("proxy: exit %d, stderr %q; want %d and %q", code, out, exitUsage, want)
	}
	out = capture(t, &os.Stderr, func() { code = explain(t.Context(), []string{dir}, io.Discard) })
	if code != exitUsage || !strings.Contains(out, want) {
		t.Errorf("explain: exit %d, stderr %q; want %d and %q", code, out, exitUsage, want)
	}
	// Not a path there, or --manifests given: no such hint.
	out = capture(t, &os.Stderr, func() { code = explain(t.Context(), []string{"--manifests", dir, dir}, io.Discard) })
	if code != exitUsage || strings.Contains(out, "goes after --manifests") {
		t.Errorf("explain with --manifests given: exit %d, stderr %q", code, out)
	}
}

// A boolean flag's value given after a space (`--iptables false`) is a
// positional argument to pflag: the error says how to give it, instead of
// only that the command takes flags and names the subcommands.
func TestBoolFlagValueAfterSpaceExplained(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--manifests", "m", "--iptables", "false"}, `--iptables takes its value after "=": --iptables=false`},
		{[]string{"--cleanup", "true"}, `--cleanup takes its value after "=": --cleanup=true`},
		{[]string{"--hostname-override", "false", "x"}, `unexpected arguments ["x"] (flags only`},
		// pflag takes the argument after a flag with a value as that
		// value, whatever it looks like: "--iptables" is the node name
		// here, and "false" no boolean flag's value.
		{[]string{"--hostname-override", "--iptables", "false"}, `unexpected arguments ["false"] (flags only`},
		// After "--" every argument is positional, flags' names included.
		{[]string{"--manifests", "m", "--", "--iptables", "false"}, `unexpected arguments ["--iptables" "false"] (flags only`},
	} {
		var code int
		out := capture(t, &os.Stderr, func() { code = runMain(tc.args) })
		if code != exitUsage || !strings.Contains(out, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, out, exitUsage, tc.want)
		}
	}
	var code int
	out := capture(t, &os.Stderr, func() {
		code = explain(t.Context(), []string{"--manifests", "m", "--iptables", "false"}, io.Discard)
	})
	if want := `--iptables takes its value after "=": --iptables=false`; code != exitUsage || !strings.Contains(out, want) {
		t.Errorf("explain: exit %d, stderr %q; want %d and %q", code, out, exitUsage, want)
	}
	out = capture(t, &os.Stderr, func() { code = runDemo([]string{"--serve", "true"}) })
	if want := `--serve takes its value after "=": --serve=true`; code != exitUsage || !strings.Contains(out, want) {
		t.Errorf("demo: exit %d, stderr %q; want %d and %q", code, out, exitUsage, want)
	}
}
