// Command kube-userspace-proxy is a node agent that makes Kubernetes
// Services work through proxy sockets in userspace, fed by an API server or a
// directory of manifests. See README.md for the flags and DESIGN.md for how
// it is built.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	apiversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/suggest"
)

// exitUsage is the status for bad flags: pflag's (ExitOnError exits 2)
// and the Go convention; kube-proxy's cli.Run exits 1 for them, but 2
// lets a supervisor tell a configuration to fix from a failure at run time.
const exitUsage = 2

func main() {
	if len(os.Args) > 1 && os.Args[1] == "demo" {
		os.Exit(runDemo(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "explain" {
		os.Exit(runExplain(os.Args[2:]))
	}
	os.Exit(runMain(os.Args[1:]))
}

func runMain(args []string) int {
	o := newOptions()
	fs := pflag.NewFlagSet("kube-userspace-proxy", pflag.ContinueOnError)
	fs.SortFlags = false
	o.addFlags(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlag(klogFlags.Lookup("v"))
	fs.AddGoFlag(klogFlags.Lookup("vmodule"))
	var showVersion versionFlag
	fs.Var(&showVersion, "version", "--version, --version=raw prints version information and quits (raw: as a Go value, as kube-proxy's).")
	fs.Lookup("version").NoOptDefVal = "true"
	// Help asked for is output (stdout, exit 0), as kube-proxy does; pflag
	// calls Usage only for -h/--help.
	fs.Usage = func() {
		fmt.Fprintf(os.Stdout, "Usage: kube-userspace-proxy [flags]\n       kube-userspace-proxy demo [--serve | --netns] [--verbose]\n       kube-userspace-proxy "+explainUsage+"\n\nFlags:\n%s", flagUsages(fs))
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy: %v\n", flagSuggestion(err, fs))
		return exitUsage
	}
	switch showVersion {
	case versionLine:
		fmt.Fprintln(os.Stdout, "kube-userspace-proxy", buildVersion())
		return 0
	case versionRaw:
		fmt.Fprintf(os.Stdout, "%#v\n", rawVersion())
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, unexpectedArguments("kube-userspace-proxy", args, fs, " (flags only; the subcommands are 'demo' and 'explain')"))
		return exitUsage
	}
	if o.configFile != "" {
		if err := o.applyConfigFile(fs); err != nil {
			fmt.Fprintf(os.Stderr, "kube-userspace-proxy: --config %s: %v\n", o.configFile, err)
			return exitUsage
		}
		o.configCheck = configChecker(args)
	}
	// The -v in force, now that --config's logging.verbosity has set it
	// unless given: /configz reports it, as kube-proxy's reports its
	// configuration's logging.
	if n, err := strconv.ParseUint(fs.Lookup("v").Value.String(), 10, 32); err == nil {
		o.logVerbosity = uint32(n)
	}
	o.logVModule = fs.Lookup("vmodule").Value.String()
	o.noteGivenFlags(fs)
	v, err := o.validate()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy: invalid flags:\n%v\n", err)
		return exitUsage
	}
	logIgnoredFlags(fs)
	if o.writeConfigTo != "" {
		// First, as kube-proxy's Run: nothing else is done.
		if err := o.writeConfig(o.writeConfigTo); err != nil {
			fmt.Fprintf(os.Stderr, "kube-userspace-proxy: --write-config-to: %v\n", err)
			return 1
		}
		klog.InfoS("Wrote the configuration", "file", o.writeConfigTo)
		return 0
	}
	// --cleanup before --init-only, as kube-proxy's Run: given both, the
	// cleanup was skipped and the exit said all was well.
	if o.cleanup {
		if !canProgramIptables() {
			fmt.Fprintf(os.Stderr, "kube-userspace-proxy: cleanup: %v\n", errNoNetAdminCleanup)
			return 1
		}
		held, pid, done := holderDuringCleanup()
		if held {
			klog.InfoS("Warning: a kube-userspace-proxy is running in this network namespace; it puts its rules back as soon as this cleanup ends: stop it first", "pid", pidValue(pid))
		}
		err := cleanupRules()
		done()
		if err != nil {
			fmt.Fprintf(os.Stderr, "kube-userspace-proxy: cleanup: %v\n", err)
			return 1
		}
		return 0
	}
	if o.initOnly {
		// As kube-proxy's, which builds its API client before --init-only
		// returns (no request is made): a client that cannot be built (a
		// kubeconfig without a usable context or server, the in-cluster
		// token or CA missing) fails the init container, not the start
		// after it.
		if o.manifests == "" {
			if _, err := apiClient(o); err != nil {
				fmt.Fprintf(os.Stderr, "kube-userspace-proxy: %v\n", err)
				return 1
			}
		}
		klog.InfoS("--init-only: this proxy has no privileged initialisation to do; exiting")
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals()...)
	defer stop()
	if err := run(ctx, o, v, nil); err != nil {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy: %v\n", err)
		return 1
	}
	return 0
}

// stopSignals end the proxy (and demo, explain) through its stop: SIGINT,
// SIGTERM and SIGHUP, a terminal's or ssh session's hang-up, which is also
// what a unit's `ExecReload=kill -HUP` or a logrotate script sends (there is
// nothing to reload: --config and the manifests are watched). Go's default
// for an uncaught SIGHUP ends the process at once, as SIGKILL does: the
// accepts of portal traffic stayed, live connections ended with a FIN, the
// state file was not written, and nothing was logged.
//
// A SIGHUP ignored at start (nohup) is left ignored: signal.Notify would
// un-ignore it, and a proxy started with `nohup ... &` from an ssh session
// stopped, taking the node's Services with it, when the session closed.
func stopSignals() []os.Signal {
	sigs := []os.Signal{syscall.SIGINT, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		sigs = append(sigs, syscall.SIGHUP)
	}
	return sigs
}

// version is set by `make static` and the image build
// (-ldflags "-X main.version=..."), whose sources carry no VCS information
// (-trimpath, no .git in the image's build context).
var version string

// flagSuggestion adds the flag a misspelt one probably meant: unknown
// flag: --bind-adress (did you mean --bind-address?). Deprecated flags are
// not suggested; hidden ones are (explain hides the proxy flags it accepts
// but does not need).
func flagSuggestion(err error, fs *pflag.FlagSet) error {
	var unknown *pflag.NotExistError
	if !errors.As(err, &unknown) || unknown.GetSpecifiedShortnames() != "" {
		return err
	}
	if slices.Contains(removedKlogFlags, strings.ReplaceAll(unknown.GetSpecifiedName(), "_", "-")) {
		return fmt.Errorf("%w (klog's flag, which Kubernetes 1.26 removed from kube-proxy and its other components: the log goes to stderr; drop the flag, and redirect stderr to keep a file)", err)
	}
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Deprecated == "" {
			names = append(names, f.Name)
		}
	})
	if s := suggest.Closest(unknown.GetSpecifiedName(), names); s != "" {
		return fmt.Errorf("%w (did you mean --%s?)", err, s)
	}
	return err
}

// removedKlogFlags are klog's flags that Kubernetes 1.26 took out of its
// components, kube-proxy's included (kubernetes#112120: only -v and
// --vmodule stayed). A command line of the legacy userspace kube-proxy
// (1.25 and before), the one this proxy replaces, may well carry them.
var removedKlogFlags = []string{"add-dir-header", "alsologtostderr", "log-backtrace-at", "log-dir", "log-file",
	"log-file-max-size", "logtostderr", "one-output", "skip-headers", "skip-log-headers", "stderrthreshold"}

// versionFlag is --version as kube-proxy's (component-base's verflag): a
// boolean flag that also takes "raw".
type versionFlag string

const (
	versionLine versionFlag = "true"
	versionRaw  versionFlag = "raw"
)

func (v *versionFlag) String() string {
	if *v == "" {
		return "false"
	}
	return string(*v)
}

func (v *versionFlag) Set(s string) error {
	if s == string(versionRaw) {
		*v = versionRaw
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("must be true, false or raw")
	}
	*v = ""
	if b {
		*v = versionLine
	}
	return nil
}

func (v *versionFlag) Type() string { return "version" }

// rawVersion is what --version=raw prints, kube-proxy's version.Info: the
// version and Go version of buildVersion, the commit and tree state the
// build recorded, the compiler and platform.
func rawVersion() apiversion.Info {
	bi, _ := debug.ReadBuildInfo()
	info := apiversion.Info{GitVersion: "(devel)", Compiler: runtime.Compiler, Platform: runtime.GOOS + "/" + runtime.GOARCH, GoVersion: runtime.Version()}
	if bi != nil {
		if bi.Main.Version != "" {
			info.GitVersion = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.GitCommit = s.Value
			case "vcs.modified":
				info.GitTreeState = map[string]string{"true": "dirty", "false": "clean"}[s.Value]
			case "vcs.time":
				info.BuildDate = s.Value
			}
		}
	}
	if version != "" {
		info.GitVersion = version
	}
	// Major and Minor as kube-proxy's carry them ("1", "37"); a build
	// without a semantic version ("(devel)") has none.
	if v, err := utilversion.ParseGeneric(info.GitVersion); err == nil {
		info.Major, info.Minor = strconv.FormatUint(uint64(v.Major()), 10), strconv.FormatUint(uint64(v.Minor()), 10)
	}
	return info
}

// unexpectedArguments is cmd's error for the positional arguments fs left
// over from args: with how to give a boolean flag's value when one is
// such a value (boolValueHint), or the flag a path of manifests goes after
// (manifestsPathHint), else with otherwise.
func unexpectedArguments(cmd string, args []string, fs *pflag.FlagSet, otherwise string) string {
	msg := fmt.Sprintf("%s: unexpected arguments %q", cmd, fs.Args())
	if hint := boolValueHint(args, fs); hint != "" {
		return msg + ": " + hint
	}
	if hint := manifestsPathHint(fs); hint != "" {
		return msg + ": " + hint
	}
	return msg + otherwise
}

// manifestsPathHint names --manifests when the one positional argument is
// a file or directory there and --manifests was not given: `explain
// examples/manifests`, as kubectl and most tools take a path, which
// "unexpected arguments" alone left to guess. "" otherwise.
func manifestsPathHint(fs *pflag.FlagSet) string {
	f := fs.Lookup("manifests")
	if f == nil || f.Changed || fs.NArg() != 1 {
		return ""
	}
	if _, err := os.Stat(fs.Arg(0)); err != nil {
		return ""
	}
	return "a path of manifests goes after --manifests: --manifests " + fs.Arg(0)
}

// boolValueHint says how to give a boolean flag's value when args gave it
// after a space (`--iptables false`): pflag never takes the next argument
// as a boolean flag's value, so it is left over as a positional argument,
// and "unexpected arguments" alone did not say why. It walks args as pflag
// does, so a value of another flag (`--hostname-override false`) is not
// taken for one; "" when no positional argument is such a value.
func boolValueHint(args []string, fs *pflag.FlagSet) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return "" // the rest is positional
		}
		if !strings.HasPrefix(a, "-") || strings.Contains(a, "=") {
			continue
		}
		var f *pflag.Flag
		if name, long := strings.CutPrefix(a, "--"); long {
			f = fs.Lookup(name)
		} else if len(a) == 2 {
			f = fs.ShorthandLookup(a[1:])
		}
		if f == nil || i+1 == len(args) {
			continue
		}
		if f.NoOptDefVal == "" {
			i++ // the next argument is this flag's value
			continue
		}
		if _, err := strconv.ParseBool(args[i+1]); err == nil && f.Value.Type() == "bool" {
			return fmt.Sprintf("--%s takes its value after \"=\": --%s=%s", f.Name, f.Name, args[i+1])
		}
	}
	return ""
}

// buildVersion is the version given at link time, else the module version
// the binary was built from ("(devel)" for a build from a checkout) with
// its commit, and the Go version.
func buildVersion() string {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(bi, version)
}

// versionOf is the version line of a build: the link-time version if set,
// else the module's version with the commit (which a pseudo-version such
// as v0.0.0-20261204211734-c1dcfee27d96 already carries: it was printed
// twice), then the Go version.
func versionOf(bi *debug.BuildInfo, linked string) string {
	v := "(devel)"
	goVersion := ""
	if bi != nil {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		goVersion = bi.GoVersion
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 && !strings.Contains(v, s.Value[:12]) {
				v += " " + s.Value[:12]
			}
		}
	}
	if linked != "" {
		v = linked
	}
	return v + " " + goVersion
}
