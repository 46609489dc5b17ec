package demo

import (
	"bytes"
	"context"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// The demo runs the real proxier against real loopback sockets and real
// time (the timing experiments' 1 s, 2 s and 4 s gaps, then the fault section): about
// 17 s each, so the end-to-end tests run in parallel and are skipped with
// -short.

// wide is a width at which no cell of the demo's tables wraps, so that a
// row reads as one line for the tests' patterns.
const wide = 400

func TestDemoMatchesRealCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the timing experiments and the fault section in real time (~17 s)")
	}
	t.Parallel()
	var out bytes.Buffer
	matched, err := Run(t.Context(), &out, Options{Width: wide}, startInProcess)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	if !matched {
		t.Errorf("demo reports a mismatch with the real cluster")
	}
	text := out.String()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`no affinity: client 1 opens 30 connections.*10/10/10 \(in turn\)\s+yes`),
		regexp.MustCompile(`client IP affinity: client 1 opens 30 connections.*30/30 on backend-[abc]\s+yes`),
		regexp.MustCompile(`client IP affinity: client 2 opens 30 connections.*30/30 on backend-[abc], client 1 on backend-[abc]\s+yes`),
		regexp.MustCompile(`affinity timeout set to 3 s.*in force after \S+\s+yes`),
		regexp.MustCompile(`1 s apart.*12/12 back on the same backend\s+yes`),
		// The fixed schedule makes round robin land elsewhere 8 times in 12,
		// but a loaded machine may delay a slot past the next one; "yes"
		// already requires at least one change.
		regexp.MustCompile(`4 s apart.*expired for 12/12; \d+/12 moved\s+yes`),
		regexp.MustCompile(`every 2 s, 7 times.*one backend for all 7\s+yes`),
		regexp.MustCompile(`client 1's pod is deleted.*5/5 on (backend-[abc]), kept there\s+yes`),
		regexp.MustCompile(`UDP, no affinity.*2/2/2 \(in turn\)\s+yes`),
		regexp.MustCompile(`Every outcome matched the real cluster: yes \(9 of 9\)`),
		regexp.MustCompile(`latency: every reply held back 300 ms.*\(\+\d+ms\), 0/40 errors\s+yes`),
		regexp.MustCompile(`reset_peer: half the connections.*\d+/40 reset by the proxy, \d+ answered\s+yes`),
		regexp.MustCompile(`Every fault behaved as expected: yes \(4 of 4\)`),
	} {
		if !want.MatchString(text) {
			t.Errorf("output lacks %q", want)
		}
	}
	checkPathPicture(t, text)
	// The demo ends with where to go next: it took everything down, so a
	// newcomer is told how to get Services to curl (demo --serve) and
	// where the proxy on their own manifests is described.
	if i := strings.LastIndex(text, "Every fault behaved as expected"); i < 0 || !strings.Contains(text[i:], "demo --serve") || !strings.Contains(text[i:], `"Running it"`) {
		t.Errorf("the demo does not end saying what to do next (demo --serve, README \"Running it\")")
	}
	// No word of the project's own history reaches a learner.
	for _, jargon := range []string{"seed", "cli1", "cli2", "44wps", "wgtmr", "qzvtf", "--seconds", "p50"} {
		if strings.Contains(strings.ReplaceAll(text, "--fault-seed", ""), jargon) {
			t.Errorf("output says %q", jargon)
		}
	}
}

// checkPathPicture checks that the packet path printed by the run names the
// addresses of the run: client 1's address, the web Service's ClusterIP and
// proxy socket as the services list shows them, and the answering backend's
// address as the backends list shows it, in the order a packet meets them.
func checkPathPicture(t *testing.T, text string) {
	t.Helper()
	web := regexp.MustCompile(`default/web:http\s+TCP (10\.96\.0\.10:80)\s+(127\.0\.0\.1:\d+)\s+none`).FindStringSubmatch(text)
	if web == nil {
		t.Fatalf("services list lacks default/web:http:\n%s", text)
	}
	i := strings.Index(text, "The path of one request")
	if i < 0 {
		t.Fatalf("no packet path:\n%s", text)
	}
	pic := text[i:]
	pic = pic[:strings.Index(pic, "Session affinity.")]
	picked := regexp.MustCompile(`picks (backend-[abc])`).FindStringSubmatch(pic)
	if picked == nil {
		t.Fatalf("the path names no backend:\n%s", pic)
	}
	backendAddr := regexp.MustCompile(picked[1] + `\s+TCP (127\.0\.0\.1:\d+)`).FindStringSubmatch(text)
	if backendAddr == nil {
		t.Fatalf("backends list lacks %s:\n%s", picked[1], text)
	}
	order := []string{"client 1", "127.0.0.11:", "portal rule", web[1], "proxy socket", web[2], "balancer", "picks " + picked[1],
		"backend ", picked[1] + " at " + backendAddr[1]}
	at := 0
	for _, want := range order {
		j := strings.Index(pic[at:], want)
		if j < 0 {
			t.Fatalf("packet path lacks %q after offset %d:\n%s", want, at, pic)
		}
		at += j + len(want)
	}
}

// syncBuffer lets the test read what the demo is still writing, and says
// when a line has appeared.
type syncBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	seen chan struct{}
	want string
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	if b.seen != nil && strings.Contains(b.buf.String(), b.want) {
		close(b.seen)
		b.seen = nil
	}
	return n, err
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDemoServe checks that --serve keeps the proxy sockets it printed open
// with all three backends back, until the context ends, and then cleans up.
func TestDemoServe(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the timing experiments and the fault section in real time (~17 s)")
	}
	t.Parallel()
	out := &syncBuffer{seen: make(chan struct{}), want: "The manifests:"}
	const width = DefaultWidth
	ready := out.seen
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type result struct {
		matched bool
		err     error
	}
	done := make(chan result, 1)
	go func() {
		m, err := Run(ctx, out, Options{Serve: true, Width: width}, startInProcess)
		done <- result{m, err}
	}()
	select {
	case <-ready:
	case r := <-done:
		t.Fatalf("demo returned before serving: %v\n%s", r.err, out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("no serving banner after 60 s:\n%s", out.String())
	}

	served := out.String()[strings.Index(out.String(), "Serving until Ctrl-C"):]
	// The table below the banner has no backends column: the banner
	// promised "its backends" over it.
	if banner, _, _ := strings.Cut(served, "\n"); strings.Contains(banner, "its backends") {
		t.Errorf("the serving banner promises backends its table does not list: %q", banner)
	}
	web := regexp.MustCompile(`default/web:http\s+TCP 10\.96\.0\.10:80\s+(127\.0\.0\.1:\d+)\s+none\n`).FindStringSubmatch(served)
	sticky := regexp.MustCompile(`default/web-sticky:http\s+TCP 10\.96\.0\.11:80\s+(127\.0\.0\.1:\d+)\s+client IP, 10800 s\n`).FindStringSubmatch(served)
	echo := regexp.MustCompile(`default/echo:echo\s+UDP 10\.96\.0\.12:7\s+(127\.0\.0\.1:\d+)`).FindStringSubmatch(served)
	if web == nil || sticky == nil || echo == nil || strings.Contains(served, "only backend") {
		t.Fatalf("serving banner lacks a service port with its three backends:\n%s", served)
	}
	// Every line fits the width, but the commands to paste: a line break
	// would break them.
	for _, line := range strings.Split(out.String(), "\n") {
		if n := len([]rune(line)); n > width && !strings.Contains(line, "curl ") && !strings.Contains(line, "bash -c") && !strings.Contains(line, "nc -u") {
			t.Errorf("line of %d runes, wider than %d: %q", n, width, line)
		}
	}
	if !strings.Contains(served, "\n    "+tryTCP("127.0.0.1", strings.Split(web[1], ":")[1])+"\n") || !strings.Contains(served, "/debug/services") {
		t.Errorf("serving banner lacks the hints:\n%s", served)
	}
	// The hints work as printed, with and without curl and nc.
	webHost, webPort, _ := strings.Cut(web[1], ":")
	echoHost, echoPort, _ := strings.Cut(echo[1], ":")
	for _, h := range []struct {
		cmd, need, want string
	}{
		{tcpHint(true, webHost, webPort), "curl", "backend-"},
		{tcpHint(false, webHost, webPort), "bash", "HTTP/1.1 200 OK"},
		{udpHint(true, echoHost, echoPort), "nc", "backend-"},
		{udpHint(false, echoHost, echoPort), "bash", ": hi"},
	} {
		if !installed(h.need) {
			t.Logf("%s is not installed here: hint %q not tried", h.need, h.cmd)
			continue
		}
		out, err := exec.CommandContext(ctx, "bash", "-c", h.cmd).CombinedOutput()
		if err != nil || !strings.Contains(string(out), h.want) || !strings.Contains(string(out), "backend-") {
			t.Errorf("hint %q: %v, output %q", h.cmd, err, out)
		}
	}

	// What a user would do: connect to the printed addresses.
	webAddr := netip.MustParseAddrPort(web[1])
	seen := map[string]bool{}
	for range 3 {
		name, err := accessTCP(ctx, loopback{}, webAddr, loopback{}.addr(99))
		if err != nil {
			t.Fatalf("printed web address: %v", err)
		}
		seen[name] = true
	}
	if len(seen) != 3 {
		t.Errorf("3 connections to web reached %v, want all three backends", seen)
	}
	if name, err := accessUDP(loopback{}, netip.MustParseAddrPort(echo[1]), loopback{}.addr(99)); err != nil || !strings.HasPrefix(name, "backend-") {
		t.Errorf("printed echo address answered %q, %v", name, err)
	}

	cancel()
	r := <-done
	if r.err != nil || !r.matched {
		t.Errorf("demo --serve = %v, %v; want matched, no error\n%s", r.matched, r.err, out.String())
	}
	// Everything is closed once demo returns: the printed socket is gone.
	if _, err := accessTCP(t.Context(), loopback{}, webAddr, loopback{}.addr(99)); err == nil {
		t.Errorf("%s still answers after the demo stopped", webAddr)
	}
}

// Ctrl-C during the experiments: the line of progress dots is ended, so
// that what the command prints next (its "interrupted" line) starts a line
// of its own; it was glued to the dots.
func TestDemoInterruptedEndsTheProgressLine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the demo (~5 s)")
	}
	t.Parallel()
	out := &syncBuffer{seen: make(chan struct{}), want: "Running 9 experiments"}
	ready := out.seen
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, out, Options{Width: wide}, startInProcess)
		done <- err
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("demo returned before the experiments: %v\n%s", err, out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("experiments not started after 60 s:\n%s", out.String())
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatalf("demo interrupted returned no error\n%s", out.String())
	}
	if text := out.String(); !strings.HasSuffix(text, "\n") {
		t.Errorf("interrupted demo's output ends mid-line: %q", text[max(0, len(text)-80):])
	}
}

func TestTally(t *testing.T) {
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{nil, ""},
		{[]string{"a"}, "1"},
		{[]string{"a", "b", "a", "c", "a", "b"}, "3/2/1"},
		{[]string{"b", "b", "a", "a"}, "2/2"},
	} {
		if _, got := tally(tc.names); got != tc.want {
			t.Errorf("tally(%v) = %q, want %q", tc.names, got, tc.want)
		}
	}
}

func TestTrialRowsJudgeOutcomes(t *testing.T) {
	seven := func(names ...string) []string {
		out := make([]string, 0, refreshTimes)
		for len(out) < refreshTimes {
			out = append(out, names...)
		}
		return out[:refreshTimes]
	}
	for _, tc := range []struct {
		name string
		res  trialResults
		want [3]bool // short, long, refresh matched
	}{
		{"all as the real cluster", trialResults{shortSame: 12, longExpired: 12, longChanged: 8, refreshed: seven("a")}, [3]bool{true, true, true}},
		{"a short trial lost its pin", trialResults{shortSame: 11, longExpired: 12, longChanged: 8, refreshed: seven("a")}, [3]bool{false, true, true}},
		{"timeout not applied: nothing expired", trialResults{shortSame: 12, longExpired: 0, longChanged: 0, refreshed: seven("a")}, [3]bool{true, false, true}},
		{"expired but round robin landed on the same backend every time", trialResults{shortSame: 12, longExpired: 12, longChanged: 0, refreshed: seven("a")}, [3]bool{true, false, true}},
		{"timeout counted from the first access", trialResults{shortSame: 12, longExpired: 12, longChanged: 8, refreshed: seven("a", "a", "b")}, [3]bool{true, true, false}},
		{"refresh series cut short", trialResults{shortSame: 12, longExpired: 12, longChanged: 8, refreshed: []string{"a"}}, [3]bool{true, true, false}},
		{"an access failed", trialResults{shortSame: 12, longExpired: 12, longChanged: 8, refreshed: seven("a"), err: context.Canceled}, [3]bool{false, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := tc.res.rows()
			for i, r := range rows {
				if r.Matched != tc.want[i] {
					t.Errorf("row %q matched = %v, want %v (ours: %s)", r.Experiment, r.Matched, tc.want[i], r.Ours)
				}
			}
		})
	}
}

func TestShellJoinQuotesWhatAShellWouldSplit(t *testing.T) {
	got := shellJoin([]string{"--manifests", "/tmp/a b", "--healthz-bind-address", "", "--iptables=false"})
	want := `--manifests "/tmp/a b" --healthz-bind-address "" --iptables=false`
	if got != want {
		t.Errorf("shellJoin = %s, want %s", got, want)
	}
}
