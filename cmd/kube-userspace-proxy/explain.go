package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier/config"
)

// runExplain is the explain subcommand: it reads the sources once and
// prints, per service port, what the proxy would serve and the rules it
// would install, without root and without touching the kernel (no socket,
// no rule). Exit status: 0, 1 when the source could not be read (an API
// server that did not answer within --timeout) or held an invalid object
// (the explanation is printed all the same), 2 for bad flags, 130 when
// interrupted.
func runExplain(args []string) int {
	return explain(context.Background(), args, os.Stdout)
}

func explain(ctx context.Context, args []string, out io.Writer) int {
	o, v, timeout, code, done := explainOptions(args)
	if done {
		return code
	}
	ctx, stop := signal.NotifyContext(ctx, stopSignals()...)
	defer stop()

	plan := proxier.NewPlan(proxier.Options{
		BindAddress:   v.bind,
		PortRange:     v.portRange,
		NodePortRange: v.nodePorts,
		NodeName:      nodeName(o.hostnameOverride),
	})
	// As the proxy (portalSyncers), which has no portals to leave out
	// with --iptables=false.
	unserved := ""
	if family, ok := bindFamily(v); ok && o.iptables {
		plan.OnlyFamily(family == iptables.IPv6)
		unserved = "IPv6"
		if family == iptables.IPv6 {
			unserved = "IPv4"
		}
	}
	// Each problem is an object (or a file, or a document) the proxy
	// would leave out: said on stdout too, and exit 1, so that CI running
	// explain on its manifests catches them; the Services left showed as
	// if nothing were wrong, even when none was valid.
	invalid := 0
	report := func(err error) {
		invalid++ // from the source's goroutine, read after readOnce has waited for it
		klog.Error("manifests: ", err)
	}
	if code := read(ctx, o, v, timeout, plan.Handler(), report); code != 0 {
		return code
	}
	// After the read, which waited for the API server (--timeout).
	if o.manifests == "" {
		if client, err := apiClient(o); err == nil { // read already reported one that fails
			readNodeObjectIPs(ctx, client, o, v, isLocalAddress)
		}
	}
	resolveNodePortAddresses(v)
	// The Node's zone decides which endpoints zone hints keep, as on the
	// proxy (its Node informer): without it every zone's were explained.
	plan.SetNodeZone(v.nodeObjectZone)
	ports, v4, v6 := plan.Run()
	cfg4, cfg6, _ := portalConfigs(v)
	nodeIPs, redirect := explainedNodeIPs(cfg4, cfg6, v4, v6)
	e := explanation{
		source: o.manifests, bind: v.bind, nodeIPs: nodeIPs, redirect: redirect, preroutingRedirect: v.preroutingRedirect, portRange: o.proxyPortRange,
		kernelPorts: plan.KernelChosenPorts(), ports: ports, noRules: !o.iptables, invalid: invalid,
		warnings: plan.Warnings(), sliceless: plan.Sliceless(), policies: plan.LocalPolicies(), unserved: unserved,
		zone: v.nodeObjectZone, node: nodeName(o.hostnameOverride),
	}
	if o.iptables {
		e.families = []familyRules{
			{name: "IPv4", rules: iptables.New(iptables.NewFakeRunner(iptables.IPv4), cfg4), portals: v4},
			{name: "IPv6", rules: iptables.New(iptables.NewFakeRunner(iptables.IPv6), cfg6), portals: v6},
		}
	}
	if e.source == "" {
		e.source, e.fromAPIServer = "the API server", true
	}
	if err := e.write(out); err != nil {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy explain: %v\n", err)
		return 1
	}
	if invalid > 0 {
		return 1
	}
	return 0
}

// explainOptions parses explain's command line (and --config) as the
// proxy's and validates it. done: explain ends now with code (0 after
// --help, exitUsage after a usage error, said on stderr).
func explainOptions(args []string) (o *options, v *validated, timeout time.Duration, code int, done bool) {
	o = newOptions()
	fs := pflag.NewFlagSet("kube-userspace-proxy explain", pflag.ContinueOnError)
	fs.SortFlags = false
	o.addFlags(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlag(klogFlags.Lookup("v"))
	timeoutFlag := fs.Duration("timeout", 30*time.Second, "How long to wait for the API server (--kubeconfig, --master) before giving up with its last error; 0 waits without limit.")
	explainFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(os.Stdout, "Usage: kube-userspace-proxy %s\n\n"+
			"Reads the Services and EndpointSlices once and prints, for each service port, the\n"+
			"iptables rules the proxy would install (one comment line per rule saying what it\n"+
			"catches), its proxy socket, its endpoints in round-robin order and its session\n"+
			"affinity; then each family's rules as iptables-restore input, with the jumps into\n"+
			"our chains as comments (the proxy adds each once). Needs no root: it opens no\n"+
			"socket and writes no rule. The flags below shape the explanation as they would\n"+
			"shape the proxy; the proxy's other flags are accepted (paste its command line)\n"+
			"and change nothing here, except --cleanup, which is refused.\n\n"+
			"Flags:\n%s", explainUsage, fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, nil, 0, 0, true
		}
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy explain: %v\n", flagSuggestion(err, fs))
		return nil, nil, 0, exitUsage, true
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, unexpectedArguments("kube-userspace-proxy explain", args, fs, ""))
		return nil, nil, 0, exitUsage, true
	}
	if o.cleanup {
		// An action, not a configuration: explaining the rules a proxy
		// would install and exiting 0 read as if the rules were removed.
		fmt.Fprintln(os.Stderr, "kube-userspace-proxy explain: --cleanup is an action, not something to explain: run `kube-userspace-proxy --cleanup` to remove the rules")
		return nil, nil, 0, exitUsage, true
	}
	if o.configFile != "" {
		if err := o.applyConfigFile(fs); err != nil {
			fmt.Fprintf(os.Stderr, "kube-userspace-proxy explain: --config %s: %v\n", o.configFile, err)
			return nil, nil, 0, exitUsage, true
		}
	}
	o.noteGivenFlags(fs)
	v, err := o.validate()
	if *timeoutFlag < 0 {
		// Bad input, as for the proxy's duration flags; it read as 0,
		// waiting without limit for an API server that may never answer.
		err = errors.Join(err, fmt.Errorf("--timeout must not be negative, got %v", *timeoutFlag))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy explain: invalid flags:\n%v\n", err)
		return nil, nil, 0, exitUsage, true
	}
	if klogFlags.Lookup("v").Value.String() == "0" {
		// The explanation is the output; the proxier's info log (each
		// service port "served") would only confuse it. Errors, such as an
		// invalid manifest, still reach stderr.
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	return o, v, *timeoutFlag, 0, false
}

// explainedNodeIPs are the node IPs of the families that have rules here,
// and the families with rules but no node IP, which fall back to REDIRECT
// (the header must say so).
func explainedNodeIPs(cfg4, cfg6 iptables.Config, v4, v6 []iptables.Portal) (nodeIPs []netip.Addr, redirect []string) {
	for _, f := range []struct {
		name    string
		ip      netip.Addr
		portals []iptables.Portal
	}{{"IPv4", cfg4.NodeIP, v4}, {"IPv6", cfg6.NodeIP, v6}} {
		switch {
		case len(f.portals) == 0:
		case f.ip.IsValid():
			nodeIPs = append(nodeIPs, f.ip)
		default:
			redirect = append(redirect, f.name)
		}
	}
	return nodeIPs, redirect
}

// explainUsage is explain's synopsis (main's usage names it too).
const explainUsage = "explain (--manifests PATH | --kubeconfig PATH | --master URL) [flags]"

// explainShown are the flags that change explain's output. The proxy's
// others are hidden from its help, not refused: a proxy's command line
// pasted after "explain" must work.
var explainShown = []string{
	"manifests", "service-cluster-ip-range", "service-node-port-range", "kubeconfig", "master", "timeout", "config",
	"bind-address", "node-ip", "proxy-port-range", "nodeport-addresses", "cluster-cidr",
	"prerouting-redirect", "iptables", "hostname-override", "v",
}

// explainFlags hides the proxy flags explain ignores and words the shown
// ones for explain, which reads its source once.
func explainFlags(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if !slices.Contains(explainShown, f.Name) {
			f.Hidden = true
		}
	})
	for name, usage := range map[string]string{
		"manifests":  "File or directory of YAML/JSON manifests (v1 Service, discovery.k8s.io/v1 EndpointSlice, v1 Endpoints), read once.",
		"kubeconfig": "Path to a kubeconfig file; read the Services and EndpointSlices of that API server once.",
		"iptables":   "With --iptables=false the proxy installs no rules: explain then lists only the proxy sockets.",
		"hostname-override": "If non-empty, use this string as the node name instead of the hostname " +
			"(which endpoints are this node's own, for a Local traffic policy).",
	} {
		fs.Lookup(name).Usage = usage
	}
}

// exitInterrupted is the status of an explain stopped by Ctrl-C (or
// SIGTERM, SIGHUP) before it had read its source: 128 + SIGINT, as a shell reports.
const exitInterrupted = 130

// read is readOnce as a one-shot command wants it: an API server that does
// not answer is said at once and given up after timeout with its last
// error, and Ctrl-C is an interruption, not an error; a proxy waits for
// its API server without limit, which left explain silent for 30 s and
// then retrying forever. It returns the exit status (0: read).
func read(ctx context.Context, o *options, v *validated, timeout time.Duration, h config.Handler, report func(error)) int {
	readCtx := ctx
	where, host := "", ""
	if o.manifests == "" {
		// A client configuration that cannot be built fails at once: not
		// something to say we wait for.
		cfg, err := config.BuildClientConfig(o.kubeconfig, o.master)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kube-userspace-proxy explain: %v\n", err)
			return 1
		}
		where, host = "the API server at "+cfg.Host, cfg.Host
		limit := "without limit (--timeout 0)"
		if timeout > 0 {
			var cancel context.CancelFunc
			readCtx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
			limit = fmt.Sprintf("for up to %s (--timeout)", timeout)
		}
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy explain: waiting for %s %s\n", where, limit)
	}
	err := readOnce(readCtx, o, v, h, report)
	switch {
	case err == nil:
		return 0
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "kube-userspace-proxy explain: interrupted before the Services were read; nothing explained")
		return exitInterrupted
	case where != "" && errors.Is(err, context.DeadlineExceeded):
		msg := fmt.Sprintf("kube-userspace-proxy explain: %s did not answer within %s (--timeout)", where, timeout)
		if last := (*config.NotSyncedError)(nil); errors.As(err, &last) && last.Last != nil {
			msg += "; last error: " + last.Last.Error()
			// A refusal is an answer: credentials it does not accept
			// (401) or a grant missing (403) read as an outage.
			switch {
			case apierrors.IsUnauthorized(last.Last) || apierrors.IsForbidden(last.Last):
				msg = fmt.Sprintf("kube-userspace-proxy explain: %s refused the reads for %s (--timeout): %v", where, timeout, last.Last)
			case config.SentPlainHTTP(last.Last):
				// So is a 400 to plain HTTP: the address wants https://.
				msg = fmt.Sprintf("kube-userspace-proxy explain: %s speaks HTTPS and was sent plain HTTP for %s (--timeout): write --master https://%s, or the kubeconfig's server so",
					where, timeout, strings.TrimPrefix(host, "http://"))
			}
		}
		fmt.Fprintln(os.Stderr, msg)
		return 1
	}
	fmt.Fprintf(os.Stderr, "kube-userspace-proxy explain: %v\n", err)
	return 1
}

// readOnce runs the flags' source until it has delivered its initial set of
// Services and EndpointSlices to h, then stops it.
// A manifest source's problems (an invalid object, an unreadable file) go
// to report, when given, instead of its error log.
func readOnce(ctx context.Context, o *options, v *validated, h config.Handler, report func(error)) error {
	synced := &syncedHandler{Handler: h, done: make(chan struct{})}
	var src source
	switch {
	case o.manifests != "" && report != nil:
		src = config.NewManifestSource(o.manifests, synced, manifestOptions(v, config.WithErrorReporter(report), config.WithoutWatcher())...)
	case o.manifests == "":
		client, err := apiClient(o)
		if err != nil {
			return err
		}
		// With the headless and ExternalName Services, which the plan
		// names as not proxied, as from manifests: the proxy's informers
		// leave them out, and explain did not mention them at all. No
		// Node informer: the Node is read once after (readNodeObjectIPs).
		src = config.NewInformerSource(client, synced, config.InformerOptions{Unproxied: true})
	default:
		var err error
		if src, err = newSource(o, v, nil, synced, nil); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srcErr := make(chan error, 1)
	go func() { srcErr <- src.Run(ctx) }()
	select {
	case <-synced.done:
		cancel()
		<-srcErr // no event after this: the plan is read alone
		return nil
	case err := <-srcErr:
		if err == nil {
			err = errors.New("the source stopped before delivering its Services")
		}
		return err
	case <-ctx.Done():
		// The source's error says what it was waiting on (an API
		// server's last refused dial).
		if err := <-srcErr; err != nil && errors.Is(err, ctx.Err()) {
			return err
		}
		return ctx.Err()
	}
}

// syncedHandler passes events on and closes done once both initial sets
// (Services and EndpointSlices) were delivered. Sources serialise calls.
type syncedHandler struct {
	config.Handler
	services, slices bool
	done             chan struct{}
}

// BeginBatch and EndBatch pass the source's batches on (config.Batcher).
func (s *syncedHandler) BeginBatch() {
	if b, ok := s.Handler.(config.Batcher); ok {
		b.BeginBatch()
	}
}

func (s *syncedHandler) EndBatch() {
	if b, ok := s.Handler.(config.Batcher); ok {
		b.EndBatch()
	}
}

func (s *syncedHandler) OnServiceSynced() {
	s.Handler.OnServiceSynced()
	s.services = true
	s.check()
}

func (s *syncedHandler) OnEndpointSlicesSynced() {
	s.Handler.OnEndpointSlicesSynced()
	s.slices = true
	s.check()
}

func (s *syncedHandler) check() {
	if s.services && s.slices {
		select {
		case <-s.done:
		default:
			close(s.done)
		}
	}
}
