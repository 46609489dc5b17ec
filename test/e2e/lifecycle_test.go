package e2e

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// Budgets from the design card: a manifest change takes effect within 1 s.
// A new Service also needs its rules written, and syncs are rate-limited to
// one per --iptables-min-sync-period (1 s), so it gets that period on top.
const (
	updateBudget     = time.Second
	newServiceBudget = 2 * time.Second
)

// untilAnswer asks s over TCP until want answers; it returns how long that
// took from since, or fails after limit.
func untilAnswer(t *testing.T, cl harness.Client, s svc, want string, since time.Time, limit time.Duration) time.Duration {
	t.Helper()
	return cl.WaitFor(t, "tcp", s.tcp(), since, limit, fmt.Sprintf("answered by %q after the manifest change", want),
		func(name string, err error) bool { return err == nil && name == want })
}

// checkLiveUpdate: an EndpointSlice change in a manifest file, and a new
// Service file, take effect without restart; the latency is measured from
// the rename of the file into the manifests directory.
func checkLiveUpdate(t *testing.T, e *env) {
	cl := e.pod1(ipLive)
	s := e.svcs["live"]
	if name, err := cl.Ask("tcp", s.tcp(), harness.AnswerTimeout); err != nil || name != "b1" {
		t.Fatalf("live before the change: %q, %v; want b1", name, err)
	}
	s.endpoints = ips(e.c, 3) // b4
	writeSvc(t, e.p.dir, s)
	epLatency := untilAnswer(t, cl, s, "b4", time.Now(), 5*time.Second)

	fresh := svc{name: "fresh", clusterIP: "10.96.0.61", endpoints: ips(e.c, 1)}
	writeSvc(t, e.p.dir, fresh)
	svcLatency := untilAnswer(t, cl, fresh, "b2", time.Now(), 5*time.Second)
	udpBegan := time.Now()
	cl.WaitServed(t, "udp", fresh.udp(), time.Now(), 5*time.Second)

	figure(t, "manifest change live: endpoints b1->b4 in %d ms; new Service answering TCP in %d ms (UDP %d ms later)",
		epLatency.Milliseconds(), svcLatency.Milliseconds(), time.Since(udpBegan).Milliseconds())
	if epLatency > updateBudget {
		t.Errorf("endpoint change took %v to take effect; budget %v", epLatency, updateBudget)
	}
	if svcLatency > newServiceBudget {
		t.Errorf("new Service took %v to answer; budget %v", svcLatency, newServiceBudget)
	}
}

// checkServiceRemoved: deleting a Service's manifest removes its rules and
// closes its proxy sockets.
func checkServiceRemoved(t *testing.T, e *env) {
	s := e.svcs["doomed"]
	dump := save(t, e.c.Node)
	ports := map[string]int{}
	for _, pn := range []struct{ port, proto string }{{"http", "tcp"}, {"dns", "udp"}} {
		p, ok := proxyPort(dump, s.portName(pn.port))
		if !ok {
			t.Fatalf("no rule for %s before removal:\n%s", s.portName(pn.port), dump)
		}
		if !listening(t, e.c.Node, pn.proto, p) {
			t.Fatalf("%s proxy port %s/%d not open before removal", s.portName(pn.port), pn.proto, p)
		}
		ports[pn.proto] = p
	}
	before := len(harness.RulesFor(dump, s.portName("http"))) + len(harness.RulesFor(dump, s.portName("dns")))

	removeSvc(t, e.p.dir, s.name)
	removed := time.Now()
	var rulesGone, socketsGone time.Duration
	for rulesGone == 0 || socketsGone == 0 {
		if time.Since(removed) > 5*time.Second {
			t.Fatalf("5 s after removing %s: rules gone after %v, sockets gone after %v (0 = not yet)\n%s",
				s.name, rulesGone, socketsGone, save(t, e.c.Node))
		}
		d := save(t, e.c.Node)
		if rulesGone == 0 && len(harness.RulesFor(d, s.portName("http")))+len(harness.RulesFor(d, s.portName("dns"))) == 0 &&
			!strings.Contains(d, "/"+s.name+":") {
			rulesGone = time.Since(removed)
		}
		if socketsGone == 0 && !listening(t, e.c.Node, "tcp", ports["tcp"]) && !listening(t, e.c.Node, "udp", ports["udp"]) {
			socketsGone = time.Since(removed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err := e.pod1(ipRR).Ask("tcp", s.tcp(), 500*time.Millisecond)
	figure(t, "Service removed: %d rules gone after %d ms, sockets tcp/%d udp/%d closed after %d ms; ClusterIP now: %v",
		before, rulesGone.Milliseconds(), ports["tcp"], ports["udp"], socketsGone.Milliseconds(), err)
	if err == nil {
		t.Errorf("%s still answers after its Service was removed", s.tcp())
	}
}

// Proxy ports differ between proxies (and across a restart when another
// process took one meanwhile); normalize them away to compare rule sets.
var portNumbers = regexp.MustCompile(`(--to-ports |--to-destination [0-9.]+:|--dport )\d+`)

// rulesOf is the rules of ours in dump, sorted.
func rulesOf(dump string) []string {
	var out []string
	for _, line := range oursIn(dump) {
		if strings.HasPrefix(line, "-A ") {
			out = append(out, line)
		}
	}
	slices.Sort(out)
	return out
}

func normalizedRules(dump string) []string {
	var out []string
	for _, line := range rulesOf(dump) {
		for _, l := range perPortGuard(line) {
			out = append(out, portNumbers.ReplaceAllString(l, "${1}N"))
		}
	}
	slices.Sort(out)
	return out
}

// guardPorts matches a guard rule of several proxy ports ("-p udp -m
// multiport --dports 1,3:5").
var guardPorts = regexp.MustCompile(`-p (\w+) -m multiport --dports ([0-9,:]+)`)

// perPortGuard writes a guard rule of several ports as one rule per port:
// which ports share a rule (a block of 16 numbers) depends on the numbers
// a run happened to get, not on what the rules do.
func perPortGuard(line string) []string {
	m := guardPorts.FindStringSubmatchIndex(line)
	if m == nil || !strings.HasPrefix(line, "-A KUBE-PROXY-PORT-GUARD") {
		return []string{line}
	}
	proto, list := line[m[2]:m[3]], line[m[4]:m[5]]
	var out []string
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(part, ":")
		if !isRange {
			hi = lo
		}
		a, _ := strconv.Atoi(lo)
		b, _ := strconv.Atoi(hi)
		for port := a; port <= b; port++ {
			out = append(out, line[:m[0]]+"-p "+proto+" -m "+proto+" --dport "+strconv.Itoa(port)+line[m[1]:])
		}
	}
	return out
}

// checkRestart: kill -9 leaves the rules behind pointing at dead sockets; a
// new proxy must serve again and converge to exactly one copy of each rule.
func checkRestart(t *testing.T, e *env) {
	// A UDP client that keeps its source port (as many DNS resolvers do).
	fixed := netip.AddrPortFrom(e.c.Pod2IPs[1], 40053)
	if _, err := fixedPort(e.c.Pod2, fixed).Ask("udp", e.svcs["rr"].udp(), harness.AnswerTimeout); err != nil {
		t.Fatalf("udp from %s before restart: %v", fixed, err)
	}
	before := save(t, e.c.Node)
	e.p.Proc.Signal(syscall.SIGKILL)
	if err := e.p.Proc.Wait(5 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("proxy after SIGKILL: %v", err)
	}
	began := time.Now()
	e.p.Start(t, startWithin)
	// A fresh client address: its UDP source ports cannot collide with
	// conntrack entries left from before the restart (that case is the
	// fixed-port check below).
	fresh := e.pod2(2)
	fresh.WaitServed(t, "tcp", e.svcs["rr"].tcp(), time.Now(), startBudget)
	serving := time.Since(began)
	checkEvenSplit(t, fresh, "tcp", e.svcs["rr"])
	checkEvenSplit(t, fresh, "udp", e.svcs["rr"])
	t.Run("UDPClientKeepsSourcePort", func(t *testing.T) { checkSamePortAfterRestart(t, e, fixed) })

	// Wait for one more sync so that everything the new process wants is in.
	time.Sleep(1500 * time.Millisecond)
	after := save(t, e.c.Node)
	if d := duplicateRules(after); len(d) > 0 {
		t.Errorf("after restart, duplicate rules:\n%s", strings.Join(d, "\n"))
	}
	want, got := normalizedRules(before), normalizedRules(after)
	if !slices.Equal(want, got) {
		t.Errorf("rules after restart differ from before (ports normalized)\nbefore:\n%s\nafter:\n%s",
			strings.Join(want, "\n"), strings.Join(got, "\n"))
	} else if kept, had := rulesOf(after), rulesOf(before); !slices.Equal(kept, had) {
		// The new process listens on the ports the old rules name (no one
		// else took them), so not one rule changes.
		t.Errorf("a restart changed proxy ports; rules before:\n%s\nafter:\n%s",
			strings.Join(had, "\n"), strings.Join(kept, "\n"))
	}
	// Every proxy port in the rules must belong to a socket of the new process.
	for _, line := range oursIn(after) {
		if m := targetPort.FindStringSubmatch(line); m != nil {
			proto := "tcp"
			if strings.Contains(line, "-p udp") {
				proto = "udp"
			}
			if p, _ := strconv.Atoi(m[1]); !listening(t, e.c.Node, proto, p) {
				t.Errorf("rule points at %s/%d, where nothing listens:\n%s", proto, p, line)
			}
		}
	}
	figure(t, "kill -9 and restart: serving again %d ms after exec; %d rules of ours before and %d after, %d duplicates",
		serving.Milliseconds(), len(want), len(got), len(duplicateRules(after)))
}

// checkCleanup: after the proxy stops, --cleanup removes every chain and
// jump of ours (IPv4 and IPv6), exits 0, and is idempotent.
func checkCleanup(t *testing.T, e *env) {
	before := len(oursIn(save(t, e.c.Node)))
	// A second proxy in the namespace says which one runs already (the
	// two would rewrite each other's rules: this is the suite's end).
	second := e.c.Node.Start("second proxy", proxyBin, "--manifests", e.p.dir, "--hostname-override", nodeName,
		"--healthz-bind-address", "127.0.0.1:10356", "--metrics-bind-address", "127.0.0.1:10349")
	wantPID := fmt.Sprintf("pid=%d", e.p.Proc.Pid)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out := second.Output()
		if strings.Contains(out, "Another kube-userspace-proxy is running") && strings.Contains(out, wantPID) {
			break
		}
		if time.Now().After(deadline) || second.Exited() {
			t.Errorf("a second proxy beside the running one (pid %d) did not say so:\n%s", e.p.Proc.Pid, out)
			break
		}
	}
	second.Signal(syscall.SIGTERM)
	_ = second.Wait(5 * time.Second)
	second.Kill()
	// Run while the proxy still runs, --cleanup says so (the proxy puts
	// its rules back at its next sync), and the proxy logs who found it.
	out, err := e.p.Cleanup()
	if err != nil {
		t.Fatalf("--cleanup beside the running proxy: %v\n%s", err, out)
	}
	if !strings.Contains(out, "is running in this network namespace") || !strings.Contains(out, wantPID) {
		t.Errorf("--cleanup beside the running proxy (pid %d) did not warn of it:\n%s", e.p.Proc.Pid, out)
	}
	for deadline := time.Now().Add(5 * time.Second); len(e.p.LogLines("found this one")) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("the running proxy did not log the --cleanup that found it")
			break
		}
	}
	e.p.Proc.Signal(syscall.SIGTERM)
	if err := e.p.Proc.Wait(5 * time.Second); err != nil && !strings.Contains(err.Error(), "signal") {
		t.Logf("proxy after SIGTERM: %v", err)
	}
	e.p.Proc.Kill()
	for i := 1; i <= 2; i++ {
		out, err := e.p.Cleanup()
		if err != nil {
			t.Fatalf("--cleanup run %d: %v\n%s", i, err, out)
		}
		if strings.Contains(out, "is running in this network namespace") {
			t.Errorf("--cleanup run %d after the proxy stopped warned of a running one:\n%s", i, out)
		}
	}
	for _, v6 := range []bool{false, true} {
		dump, err := e.c.Node.IPTablesSave(v6)
		if err != nil {
			t.Fatal(err)
		}
		if left := oursIn(dump); len(left) > 0 {
			t.Errorf("after --cleanup (v6=%v), still ours:\n%s", v6, strings.Join(left, "\n"))
		}
	}
	figure(t, "--cleanup: %d lines of ours before, 0 expected after (IPv4+IPv6), run twice, exit 0", before)
}

// fixedPort is a client in ns that sends from src, source port included.
func fixedPort(ns *netns.NS, src netip.AddrPort) harness.Client {
	return harness.Client{NS: ns, Src: src.Addr(), SrcPort: src.Port()}
}

// checkSamePortAfterRestart: the client that used fixed before the restart
// asks again from the same port. Its conntrack entry still REDIRECTs to the
// old process's proxy port (the kernel keeps a UDP entry 30 s after the
// last packet, and every retry refreshes it), so unless the proxy clears
// stale UDP conntrack entries for its service IPs, the client is black-holed
// for as long as it keeps retrying.
func checkSamePortAfterRestart(t *testing.T, e *env, fixed netip.AddrPort) {
	dst := e.svcs["rr"].udp()
	attempts, took, err := askUDPAgain(fixedPort(e.c.Pod2, fixed), dst)
	figure(t, "UDP client reusing source port %s across kill -9/restart: %d attempt(s) in %d ms, last error %v",
		fixed, attempts, took.Milliseconds(), err)
	if err != nil {
		t.Errorf("udp %s from %s (same source port as before the restart): no answer in 6 tries over %v: %v; "+
			"a stale conntrack entry still points at the old proxy port: the proxy must clear UDP conntrack entries "+
			"for its service IPs when a UDP proxy port changes (restart, Service re-created)",
			dst, fixed, took.Round(time.Millisecond), err)
		newPort, _ := proxyPort(save(t, e.c.Node), e.svcs["rr"].portName("dns"))
		t.Logf("new proxy port for %s: %d; node conntrack entries for the client:\n%s",
			e.svcs["rr"].portName("dns"), newPort, conntrackFor(e.c.Node, fixed))
	}
}

// conntrackFor returns the node's conntrack entries whose original source
// is src (from /proc/net/nf_conntrack, when the kernel provides it).
func conntrackFor(ns *netns.NS, src netip.AddrPort) string {
	out, err := ns.Exec("cat", "/proc/net/nf_conntrack")
	if err != nil {
		return err.Error()
	}
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "src="+src.Addr().String()+" ") && strings.Contains(line, fmt.Sprintf("sport=%d ", src.Port())) {
			keep = append(keep, strings.Join(strings.Fields(line), " "))
		}
	}
	return strings.Join(keep, "\n")
}
